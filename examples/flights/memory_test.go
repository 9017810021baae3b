package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// heapSampler records, every millisecond until stopped, the largest live
// heap the garbage collector found ("/gc/heap/live:bytes": the bytes its
// last cycle marked) and the largest heap in use ("/memory/classes/heap/
// objects:bytes": live objects and garbage not yet swept).
type heapSampler struct {
	stop                chan struct{}
	done                sync.WaitGroup
	maxLive, maxObjects uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{})}
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			h.maxLive = max(h.maxLive, s[0].Value.Uint64())
			h.maxObjects = max(h.maxObjects, s[1].Value.Uint64())
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) Stop() {
	close(h.stop)
	h.done.Wait()
}

// TestLoadMemory loads the first 20 days of the real file (two row groups)
// with the demo's defaults and checks that the live heap stays within what
// the load needs: the rows the library spools (a quarter of Config.MemoryBudget, all spools
// of the process together), the extractor's decoded row groups, and the
// runner's staging and connections. It measures the live heap the garbage
// collector found, not the heap in use, which also holds garbage and
// depends on when collections happen. Here the live heap peaks at 22-26
// MiB; an extractor that held each chunk's decoded parquet pages (about
// 9 MB per chunk being extracted) peaked at 38-39 MiB. Not parallel: other
// tests would share the heap.
func TestLoadMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	path := filepath.Join("data", flightsFile)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not fetched (run fetch-data.sh)", path)
	}
	src, err := OpenFlights(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	first, _, _ := src.Scope()
	days := backfill.Days(first, first.AddDate(0, 0, 20), time.UTC)
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()

	runtime.GC()
	h := sampleHeap()
	var out bytes.Buffer
	rep, err := load(ctx, &out, db, nil, src, days, filepath.Join("data", airportsFile), options{concurrency: 2})
	h.Stop()
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}
	if rep.Counts.Read < 300_000 || rep.Counts.Inserted != rep.Counts.Read {
		t.Fatalf("counts %+v, want all of 20 days' rows (over 300,000) inserted", rep.Counts)
	}
	const mib = 1 << 20
	// A decoded row group of this file takes about 3 MiB (2.2 MB of codes
	// and its dictionaries): allow for two being read and one kept, plus
	// one column's pages being decoded by parquet-go (about 2 MiB), and 5
	// MiB for the runner's staging (converted values, keys) and the rest.
	bound := uint64(backfill.DefaultMemoryBudget/4) + 3*3*mib + 2*mib + 5*mib
	t.Logf("largest live heap %.1f MiB (bound %.1f MiB), largest heap in use %.1f MiB, %d rows",
		float64(h.maxLive)/mib, float64(bound)/mib, float64(h.maxObjects)/mib, rep.Counts.Read)
	if h.maxLive > bound {
		t.Errorf("largest live heap %.1f MiB, want at most %.1f MiB", float64(h.maxLive)/mib, float64(bound)/mib)
	}
}
