package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"

	"github.com/pgbackfill/backfill"
)

// day0 is the first day of the synthetic data.
var day0 = time.Date(2024, 3, 9, 0, 0, 0, 0, time.UTC)

// ms returns day0 + d in milliseconds since the epoch.
func ms(d time.Duration) int64 { return day0.Add(d).UnixMilli() }

// feat builds a USGS-like GeoJSON feature. A nil id, time or updated is
// left out; geometry nil is JSON null.
func feat(id, tm, updated any, mag any, status string, coords ...any) map[string]any {
	props := map[string]any{
		"mag": mag, "place": "10km N of Somewhere, CA", "status": status, "type": "earthquake",
		"magType": "ml", "tz": -480, "title": "synthetic",
	}
	if tm != nil {
		props["time"] = tm
	}
	if updated != nil {
		props["updated"] = updated
	}
	f := map[string]any{"type": "Feature", "properties": props, "geometry": nil}
	if coords != nil {
		f["geometry"] = map[string]any{"type": "Point", "coordinates": coords}
	}
	if id != nil {
		f["id"] = id
	}
	return f
}

// synthetic returns a small FeatureCollection over three UTC days
// (2024-03-09 to 2024-03-11), newest first like the USGS feed, with three
// features that cannot be loaded: no id, no time, a non-numeric mag.
func synthetic() map[string]any {
	h := time.Hour
	fs := []any{
		feat("ci3", ms(48*h+20*h), ms(48*h+21*h), 3.1, "automatic", -117.5, 33.9, 8.2),
		feat("ak2", ms(48*h+1*h), ms(48*h+2*h), 1.4, "reviewed", -150.1, 61.2, 35.0),
		feat(nil, ms(30*h), ms(31*h), 2.2, "automatic", -122.8, 38.8, 1.9),                                               // no id
		feat("nc9", ms(36*h), ms(37*h), "big", "automatic", -122.8, 38.8, 2.0),                                           // mag is not a number
		feat("nc1", ms(24*h), ms(24*h+30*time.Minute), 2.7, "automatic", -122.7, 38.7, 3.0),                              // exactly at midnight: day 2
		feat("us7", ms(23*h+59*time.Minute+59*time.Second+999*time.Millisecond), ms(25*h), 4.5, "reviewed", 142.3, 38.3), // no depth
		feat("hv5", ms(12*h), ms(13*h), nil, "reviewed", -155.3, 19.4, 30.1),                                             // NULL mag
		feat("pr4", ms(6*h), ms(7*h), 2.9, "automatic"),                                                                  // null geometry
		feat("nn8", nil, ms(7*h), 1.0, "automatic", -119.0, 38.0, 5.0),                                                   // no time
		feat("uw6", ms(0), ms(1*h), 0.5, "automatic", -122.0, 47.0, -0.5),                                                // first instant of day 1
	}
	return map[string]any{"type": "FeatureCollection", "metadata": map[string]any{"count": len(fs)}, "features": fs}
}

const syntheticRejects = 3

// The synthetic source rejects 3 of its few events on purpose: no
// run-level reject gate in the tests.
func init() { maxRunRejectRate = -1 }

func writeJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), quakesFile)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func openSynthetic(t *testing.T) *Quakes {
	t.Helper()
	src, err := OpenQuakes(writeJSON(t, synthetic()))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// recorder is a RowWriter that keeps what it is given.
type recorder struct {
	rows    [][]any
	rejects []reject1
}

type reject1 struct {
	raw            map[string]any
	column, reason string
}

func (r *recorder) Write(ctx context.Context, values ...any) error {
	r.rows = append(r.rows, values)
	return nil
}

func (r *recorder) Reject(ctx context.Context, raw any, column, reason string) error {
	r.rejects = append(r.rejects, reject1{raw.(map[string]any), column, reason})
	return nil
}

func extractAll(t *testing.T, src *Quakes, chunker backfill.Chunker) []*recorder {
	t.Helper()
	chunks, err := chunker.Chunks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*recorder, len(chunks))
	for i, c := range chunks {
		out[i] = &recorder{}
		if err := src.Extract(context.Background(), c, out[i]); err != nil {
			t.Fatalf("chunk %s: %v", c, err)
		}
	}
	return out
}

func TestConvert(t *testing.T) {
	src := openSynthetic(t)
	if src.Len() != 10 || len(src.untimed) != 1 {
		t.Fatalf("%d features, %d untimed; want 10, 1", src.Len(), len(src.untimed))
	}
	first, end, ok := src.Scope()
	if want := day0.AddDate(0, 0, 3); !ok || !first.Equal(day0) || !end.Equal(want) {
		t.Errorf("Scope = %s, %s, %t; want %s, %s", first, end, ok, day0, want)
	}
	var got []string
	for _, f := range src.Features() {
		got = append(got, f.Quake.ID+"|"+f.Column+"|"+f.Reason)
	}
	want := []string{
		"uw6||", "pr4||", "hv5||", "us7||", "nc1||",
		"|id|feature id: missing",
		"nc9|mag|property mag: \"big\" is not a number",
		"ak2||", "ci3||",
		"|event_time|property time: missing",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("features in time order (-want +got):\n%s", diff)
	}
	byID := map[string]Quake{}
	for _, f := range src.Features() {
		byID[f.Quake.ID] = f.Quake
	}
	if q := byID["us7"]; q.Depth != nil || q.Lon == nil || *q.Lat != 38.3 {
		t.Errorf("us7 (two coordinates): %+v", q)
	}
	if q := byID["pr4"]; q.Lon != nil || q.Lat != nil || q.Depth != nil {
		t.Errorf("pr4 (null geometry): %+v", q)
	}
	if q := byID["hv5"]; q.Mag != nil || *q.TZ != -480 || !q.Updated.Equal(day0.Add(13*time.Hour)) {
		t.Errorf("hv5 (null mag): %+v", q)
	}

	for _, c := range []struct{ feature, column, reason string }{
		{`[1]`, "", "malformed feature"},
		{`{"id":"x","properties":{"time":1.5e12,"updated":1}}`, "event_time", "not an integer number of milliseconds"},
		{`{"id":"x","properties":{"time":1}}`, "source_updated_at", "property updated: missing"},
		{`{"id":"","properties":{"time":1,"updated":1}}`, "id", "feature id: missing"},
		{`{"id":{},"properties":{"time":1,"updated":1}}`, "id", "is not a string"},
		{`{"id":"x","properties":{"time":1,"updated":1,"tz":"PST"}}`, "tz_offset_min", "is not an integer"},
		{`{"id":"x","properties":{"time":1,"updated":1},"geometry":{"type":"Polygon","coordinates":[]}}`, "lon", "want Point"},
		{`{"id":"x","properties":{"time":1,"updated":1},"geometry":{"type":"Point","coordinates":[1]}}`, "lon", "1 coordinates"},
		{`{"id":"x","properties":{"time":1,"updated":1},"geometry":{"type":"Point","coordinates":[1,null]}}`, "lat", "null"},
		{`{"id":"x","properties":{"time":1,"updated":1},"geometry":{"type":"Point","coordinates":[200,1]}}`, "lat", "out of range"},
		{`{"id":7,"properties":{"time":1,"updated":1}}`, "", ""},
	} {
		f := convert(0, json.RawMessage(c.feature))
		if f.Column != c.column || !strings.Contains(f.Reason, c.reason) || (c.reason == "") != (f.Reason == "") {
			t.Errorf("convert(%s) = column %q, reason %q; want %q, containing %q", c.feature, f.Column, f.Reason, c.column, c.reason)
		}
	}
	if f := convert(0, json.RawMessage(`{"id":7,"properties":{"time":1,"updated":1}}`)); f.Quake.ID != "7" {
		t.Errorf("numeric id: %q, want \"7\"", f.Quake.ID)
	}
	if _, err := ParseQuakes([]byte(`{"type":"Feature"}`)); err == nil {
		t.Error("a Feature accepted as a FeatureCollection")
	}
}

// Every feature is extracted exactly once, in the chunk whose half-open
// interval holds its event time, whatever the chunking; the feature
// without a time is rejected once, by the first chunk.
func TestExtractTilesScope(t *testing.T) {
	src := openSynthetic(t)
	first, end, _ := src.Scope()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for name, chunker := range map[string]backfill.Chunker{
		"days":    backfill.Days(first, end, time.UTC),
		"hours":   backfill.Hours(first, end, time.UTC),
		"ny-days": backfill.Days(first.Add(-5*time.Hour), end, ny), // 2024-03-10 is a 23-hour day in New York
	} {
		t.Run(name, func(t *testing.T) {
			chunks, _ := chunker.Chunks(context.Background())
			recs := extractAll(t, src, chunker)
			seen := map[string]int{}
			rejects := map[string]int{}
			for i, r := range recs {
				for _, row := range r.rows {
					id, at := row[0].(string), row[1].(time.Time)
					seen[id]++
					if !chunks[i].Contains(at) {
						t.Errorf("%s at %s extracted by chunk %s", id, at, chunks[i])
					}
				}
				for _, rj := range r.rejects {
					rejects[rj.column]++
					if rj.column == "event_time" && i != 0 {
						t.Errorf("untimed feature rejected by chunk %d", i)
					}
					if _, ok := rj.raw["feature_index"]; !ok {
						t.Errorf("reject without feature_index: %v", rj.raw)
					}
				}
			}
			for _, f := range src.Features() {
				if f.Reason == "" && seen[f.Quake.ID] != 1 {
					t.Errorf("%s extracted %d times", f.Quake.ID, seen[f.Quake.ID])
				}
			}
			if diff := cmp.Diff(map[string]int{"id": 1, "mag": 1, "event_time": 1}, rejects); diff != "" {
				t.Errorf("rejects by column (-want +got):\n%s", diff)
			}
		})
	}
	// Half-open days: 23:59:59.999 is the first day's, 00:00 the second's.
	recs := extractAll(t, src, backfill.Days(first, end, time.UTC))
	ids := func(r *recorder) (s []string) {
		for _, row := range r.rows {
			s = append(s, row[0].(string))
		}
		return s
	}
	if diff := cmp.Diff([][]string{{"uw6", "pr4", "hv5", "us7"}, {"nc1"}, {"ak2", "ci3"}}, [][]string{ids(recs[0]), ids(recs[1]), ids(recs[2])}); diff != "" {
		t.Errorf("ids per day (-want +got):\n%s", diff)
	}
}

func TestExtractRefusesIntChunks(t *testing.T) {
	src := openSynthetic(t)
	err := src.Extract(context.Background(), backfill.Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}, &recorder{})
	if err == nil || !strings.Contains(err.Error(), "want time") {
		t.Errorf("Extract(int chunk) = %v", err)
	}
}

func TestCorrections(t *testing.T) {
	src := openSynthetic(t)
	corr := Corrections(src, 2)
	var got []string
	for _, c := range corr {
		got = append(got, c.Quake.ID)
		orig := src.feats[0]
		for _, f := range src.feats {
			if f.Quake.ID == c.Quake.ID {
				orig = f
			}
		}
		if *c.Quake.Status != "reviewed" || math.Abs(*c.Quake.Mag-(*orig.Quake.Mag+0.3)) > 0.005 ||
			!c.Quake.Updated.Equal(orig.Quake.Updated.Add(correctionDelay)) || !c.Quake.Time.Equal(orig.Quake.Time) {
			t.Errorf("correction %+v of %+v", c.Quake, orig.Quake)
		}
		if *orig.Quake.Status != "automatic" {
			t.Errorf("the source was changed: %+v", orig.Quake)
		}
	}
	// Automatic events with a numeric mag, highest first: ci3 3.1, pr4 2.9.
	if diff := cmp.Diff([]string{"ci3", "pr4"}, got); diff != "" {
		t.Errorf("corrected events (-want +got):\n%s", diff)
	}
}

// TestRealFile checks the fetched data/earthquakes.json, if present.
func TestRealFile(t *testing.T) {
	src, err := OpenQuakes(filepath.Join("data", quakesFile))
	if os.IsNotExist(err) {
		t.Skip("data/earthquakes.json not fetched (fetch-data.sh)")
	}
	if err != nil {
		t.Fatal(err)
	}
	first, end, _ := src.Scope()
	recs := extractAll(t, src, backfill.Days(first, end, time.UTC))
	var perDay []int
	ids := map[string]bool{}
	for _, r := range recs {
		perDay = append(perDay, len(r.rows))
		if len(r.rejects) > 0 {
			t.Errorf("rejects: %+v", r.rejects)
		}
		for _, row := range r.rows {
			ids[row[0].(string)] = true
		}
	}
	if diff := cmp.Diff([]int{198, 231, 242, 259, 301, 249, 213, 14}, perDay); diff != "" {
		t.Errorf("events per UTC day from 2018-01-31 (-want +got):\n%s", diff)
	}
	if len(ids) != 1707 {
		t.Errorf("%d distinct ids, want 1707", len(ids))
	}
}
