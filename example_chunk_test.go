package backfill_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
)

// A week of calendar days in New York across the start of daylight saving
// time: Sunday 2024-03-10 is 23 hours long.
func ExampleDays() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	start := time.Date(2024, 3, 7, 0, 0, 0, 0, ny)
	end := time.Date(2024, 3, 14, 0, 0, 0, 0, ny)
	c := backfill.Days(start, end, ny)
	chunks, err := c.Chunks(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Scope())
	for _, ch := range chunks {
		fmt.Println(ch.Seq, ch)
	}
	fmt.Println(chunks[3].ID)
	// Output:
	// days [2024-03-07T00:00:00-05:00, 2024-03-14T00:00:00-04:00) America/New_York
	// 0 [2024-03-07T00:00:00-05:00, 2024-03-08T00:00:00-05:00) America/New_York 24h0m0s
	// 1 [2024-03-08T00:00:00-05:00, 2024-03-09T00:00:00-05:00) America/New_York 24h0m0s
	// 2 [2024-03-09T00:00:00-05:00, 2024-03-10T00:00:00-05:00) America/New_York 24h0m0s
	// 3 [2024-03-10T00:00:00-05:00, 2024-03-11T00:00:00-04:00) America/New_York 23h0m0s
	// 4 [2024-03-11T00:00:00-04:00, 2024-03-12T00:00:00-04:00) America/New_York 24h0m0s
	// 5 [2024-03-12T00:00:00-04:00, 2024-03-13T00:00:00-04:00) America/New_York 24h0m0s
	// 6 [2024-03-13T00:00:00-04:00, 2024-03-14T00:00:00-04:00) America/New_York 24h0m0s
	// time:2024-03-10T00:00:00-05:00/2024-03-11T00:00:00-04:00
}

// Hours in New York on the night daylight saving time starts: the clock
// jumps from 02:00 to 03:00, so no chunk starts at 02:00.
func ExampleHours() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	start := time.Date(2024, 3, 10, 0, 0, 0, 0, ny)
	end := time.Date(2024, 3, 10, 4, 0, 0, 0, ny)
	chunks, err := backfill.Hours(start, end, ny).Chunks(context.Background())
	if err != nil {
		panic(err)
	}
	for _, ch := range chunks {
		fmt.Println(ch)
	}
	// Output:
	// [2024-03-10T00:00:00-05:00, 2024-03-10T01:00:00-05:00) America/New_York 1h0m0s
	// [2024-03-10T01:00:00-05:00, 2024-03-10T03:00:00-04:00) America/New_York 1h0m0s
	// [2024-03-10T03:00:00-04:00, 2024-03-10T04:00:00-04:00) America/New_York 1h0m0s
}

// A key range whose last chunk is clipped to the upper bound.
func ExampleIntRange() {
	c := backfill.IntRange(0, 2500, 1000)
	chunks, err := c.Chunks(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Scope())
	for _, ch := range chunks {
		fmt.Println(ch.ID, ch)
	}
	// Output:
	// int [0, 2500) step 1000
	// int:0/1000 [0, 1000)
	// int:1000/2000 [1000, 2000)
	// int:2000/2500 [2000, 2500)
}

// One chunk per tenant, in the given order.
func ExampleList() {
	c := backfill.List("acme", "globex", "initech")
	chunks, err := c.Chunks(context.Background())
	if err != nil {
		panic(err)
	}
	for _, ch := range chunks {
		fmt.Println(ch.Seq, ch.ID)
	}
	// Output:
	// 0 list:acme
	// 1 list:globex
	// 2 list:initech
}

// The built-in chunkers are ChunkStreamers: their chunks one at a time,
// which is how a Runner plans a long scope without holding it, and a
// chunk rebuilt from what the manifest records of it (a time chunk's
// bounds come back in UTC; ChunkOf puts them in the chunker's location).
func ExampleChunkStreamer() {
	ctx := context.Background()
	c := backfill.IntRange(0, 1_000_000, 1).(backfill.ChunkStreamer)
	n := 0
	for ch, err := range c.ChunkSeq(ctx) {
		if err != nil {
			panic(err)
		}
		n++
		if ch.Seq == 999_999 {
			fmt.Println(n, ch.ID)
		}
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	start := time.Date(2024, 3, 10, 0, 0, 0, 0, ny)
	days := backfill.Days(start, start.AddDate(0, 0, 2), ny).(backfill.ChunkStreamer)
	recorded := backfill.Chunk{Seq: 0, Kind: backfilltype.KindTime, Start: start.UTC(), End: start.AddDate(0, 0, 1).UTC(),
		ID: "time:2024-03-10T00:00:00-05:00/2024-03-11T00:00:00-04:00"}
	ch, ok := days.ChunkOf(recorded)
	fmt.Println(ok, ch)
	recorded.End = recorded.End.Add(time.Hour) // not a day of the scope
	_, ok = days.ChunkOf(recorded)
	fmt.Println(ok)
	// Output:
	// 1000000 int:999999/1000000
	// true [2024-03-10T00:00:00-05:00, 2024-03-11T00:00:00-04:00) America/New_York 23h0m0s
	// false
}
