package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
)

// quakeColumns are the target columns, in the order Extract writes them.
var quakeColumns = []string{
	"id", "event_time", "source_updated_at", "mag", "mag_type", "place",
	"status", "type", "tz_offset_min", "lon", "lat", "depth_km",
}

// quakeKey is the business key: the USGS event id.
var quakeKey = []string{"id"}

// versionColumn is the source's modification time, compared by
// [backfill.NewerVersionWins].
const versionColumn = "source_updated_at"

// Quake is one USGS event, converted. Pointer fields are NULL when nil.
// The db tags name the target columns.
type Quake struct {
	ID string `db:"id"`
	// Time is the event (origin) time: when the earthquake happened.
	Time time.Time `db:"event_time"`
	// Updated is when USGS last modified the event: the source version.
	Updated time.Time `db:"source_updated_at"`
	Mag     *float64  `db:"mag"`
	MagType *string   `db:"mag_type"`
	Place   *string   `db:"place"`
	Status  *string   `db:"status"`
	Type    *string   `db:"type"`
	// TZ is the source's "tz": the UTC offset in minutes at the epicentre.
	TZ    *int64   `db:"tz_offset_min"`
	Lon   *float64 `db:"lon"`
	Lat   *float64 `db:"lat"`
	Depth *float64 `db:"depth_km"`
}

// values returns q in quakeColumns order.
func (q Quake) values() []any {
	return []any{q.ID, q.Time, q.Updated, q.Mag, q.MagType, q.Place,
		q.Status, q.Type, q.TZ, q.Lon, q.Lat, q.Depth}
}

// Feature is one element of the FeatureCollection's "features" array: the
// converted event, or why it cannot be converted.
type Feature struct {
	// Pos is the 0-based position in the file's "features" array.
	Pos int
	// Raw is the feature as the file holds it (stored with a reject).
	Raw json.RawMessage
	// Quake is the converted event; ID, Time or Updated may be zero if
	// Reason is set.
	Quake Quake
	// HasTime is false when the feature has no usable event time: it
	// cannot be placed in any chunk.
	HasTime bool
	// Column and Reason are set when the feature cannot be loaded.
	Column, Reason string
}

// Quakes is a set of USGS GeoJSON features held in memory, sorted by event
// time. It implements [backfill.Extractor] for [backfilltype.KindTime] chunks.
//
// The whole file is read once: earthquakes.json is 1.2 MB and 1,707
// features, so each chunk filters the in-memory, time-sorted slice (a
// binary search for its first feature). A source too big for memory
// would need an index of positions or a source that can be queried by
// time, as examples/flights does with its parquet file.
type Quakes struct {
	// feats are the features with an event time, sorted by it (stable:
	// features of equal time keep their input order).
	feats []Feature
	// untimed are the features without a usable event time, in input
	// order. The chunk with Seq 0 rejects them (see Extract).
	untimed []Feature
}

// OpenQuakes reads and converts a GeoJSON FeatureCollection.
func OpenQuakes(path string) (*Quakes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	q, err := ParseQuakes(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return q, nil
}

// ParseQuakes converts a GeoJSON FeatureCollection. It fails only when the
// document is not a FeatureCollection; a feature that cannot be converted
// is kept with its reason and rejected when its chunk is extracted.
func ParseQuakes(b []byte) (*Quakes, error) {
	var doc struct {
		Type     string            `json:"type"`
		Features []json.RawMessage `json:"features"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("not a GeoJSON document: %w", err)
	}
	if doc.Type != "FeatureCollection" {
		return nil, fmt.Errorf("GeoJSON type %q, want FeatureCollection", doc.Type)
	}
	fs := make([]Feature, len(doc.Features))
	for i, raw := range doc.Features {
		fs[i] = convert(i, raw)
	}
	return NewQuakes(fs), nil
}

// NewQuakes returns a source of the given features (in this order for
// features of equal event time).
func NewQuakes(fs []Feature) *Quakes {
	q := &Quakes{}
	for _, f := range fs {
		if f.HasTime {
			q.feats = append(q.feats, f)
		} else {
			q.untimed = append(q.untimed, f)
		}
	}
	slices.SortStableFunc(q.feats, func(a, b Feature) int { return a.Quake.Time.Compare(b.Quake.Time) })
	return q
}

// Features returns every feature: those with an event time in time order,
// then the others.
func (q *Quakes) Features() []Feature {
	return append(slices.Clone(q.feats), q.untimed...)
}

// Len returns the number of features.
func (q *Quakes) Len() int { return len(q.feats) + len(q.untimed) }

// Scope returns the UTC days [first, end) that hold every event time: UTC
// midnight of the earliest, and UTC midnight after the latest. ok is false
// when no feature has a time.
func (q *Quakes) Scope() (first, end time.Time, ok bool) {
	if len(q.feats) == 0 {
		return time.Time{}, time.Time{}, false
	}
	day := 24 * time.Hour
	lo, hi := q.feats[0].Quake.Time, q.feats[len(q.feats)-1].Quake.Time
	return lo.UTC().Truncate(day), hi.UTC().Truncate(day).Add(day), true
}

// Extract writes the events whose event time lies in the half-open
// [c.Start, c.End) (compared as instants, so chunks in any zone work), in
// time order, and rejects the features among them that cannot be
// converted. The chunk with Seq 0 also rejects every feature without a
// usable event time: such a feature belongs to no chunk, and rejecting it
// in the plan's first chunk records it exactly once per run.
func (q *Quakes) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	if c.Kind != backfilltype.KindTime {
		return fmt.Errorf("earthquakes: extract: chunk %s is %s, want %s", c.ID, c.Kind, backfilltype.KindTime)
	}
	if c.Seq == 0 {
		for _, f := range q.untimed {
			if err := reject(ctx, w, f); err != nil {
				return err
			}
		}
	}
	i := sort.Search(len(q.feats), func(i int) bool { return !q.feats[i].Quake.Time.Before(c.Start) })
	for ; i < len(q.feats) && q.feats[i].Quake.Time.Before(c.End); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		f := q.feats[i]
		var err error
		if f.Reason != "" {
			err = reject(ctx, w, f)
		} else {
			err = w.Write(ctx, f.Quake.values()...)
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// reject records f in the exception queue: the feature as the file holds
// it, with its position.
func reject(ctx context.Context, w backfill.RowWriter, f Feature) error {
	raw := map[string]any{"feature_index": f.Pos, "feature": f.Raw}
	if !json.Valid(f.Raw) {
		raw["feature"] = string(f.Raw)
	}
	return w.Reject(ctx, raw, f.Column, f.Reason)
}

// convert turns one GeoJSON feature into a Feature. USGS's feed format
// (https://earthquake.usgs.gov/earthquakes/feed/v1.0/geojson.php): "id" is
// the event id; properties "time" and "updated" are milliseconds since the
// Unix epoch; geometry is a Point [longitude, latitude, depth in km].
func convert(pos int, raw json.RawMessage) Feature {
	f := Feature{Pos: pos, Raw: raw}
	var doc struct {
		ID         json.RawMessage `json:"id"`
		Properties struct {
			Mag     json.RawMessage `json:"mag"`
			Place   json.RawMessage `json:"place"`
			Time    json.RawMessage `json:"time"`
			Updated json.RawMessage `json:"updated"`
			TZ      json.RawMessage `json:"tz"`
			Status  json.RawMessage `json:"status"`
			Type    json.RawMessage `json:"type"`
			MagType json.RawMessage `json:"magType"`
		} `json:"properties"`
		Geometry *struct {
			Type        string            `json:"type"`
			Coordinates []json.RawMessage `json:"coordinates"`
		} `json:"geometry"`
	}
	fail := func(column, reason string) Feature {
		f.Column, f.Reason = column, reason
		return f
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fail("", "malformed feature: "+err.Error())
	}
	p := doc.Properties
	// The event time first: it places the feature in a chunk.
	t, err := millis(p.Time)
	if err != nil {
		return fail("event_time", "property time: "+err.Error())
	}
	f.Quake.Time, f.HasTime = t, true

	id, err := text(doc.ID)
	if err != nil || id == nil || *id == "" {
		if err == nil {
			err = errors.New("missing")
		}
		return fail("id", "feature id: "+err.Error())
	}
	f.Quake.ID = *id
	if f.Quake.Updated, err = millis(p.Updated); err != nil {
		return fail("source_updated_at", "property updated: "+err.Error())
	}
	q := &f.Quake
	for _, x := range []struct {
		column string
		raw    json.RawMessage
		dst    **string
	}{{"mag_type", p.MagType, &q.MagType}, {"place", p.Place, &q.Place}, {"status", p.Status, &q.Status}, {"type", p.Type, &q.Type}} {
		if *x.dst, err = text(x.raw); err != nil {
			return fail(x.column, "property "+x.column+": "+err.Error())
		}
	}
	if q.Mag, err = number(p.Mag); err != nil {
		return fail("mag", "property mag: "+err.Error())
	}
	if q.TZ, err = integer(p.TZ); err != nil {
		return fail("tz_offset_min", "property tz: "+err.Error())
	}
	if g := doc.Geometry; g != nil {
		if g.Type != "Point" {
			return fail("lon", fmt.Sprintf("geometry type %q, want Point", g.Type))
		}
		if n := len(g.Coordinates); n < 2 || n > 3 {
			return fail("lon", fmt.Sprintf("point has %d coordinates, want 2 or 3", n))
		}
		names := []string{"lon", "lat", "depth_km"}
		for i, dst := range []**float64{&q.Lon, &q.Lat, &q.Depth}[:len(g.Coordinates)] {
			name := names[i]
			if *dst, err = number(g.Coordinates[i]); err != nil || *dst == nil {
				if err == nil {
					err = errors.New("null")
				}
				return fail(name, "coordinate "+name+": "+err.Error())
			}
		}
		if math.Abs(*q.Lon) > 180 || math.Abs(*q.Lat) > 90 {
			return fail("lat", fmt.Sprintf("coordinates (%g, %g) out of range", *q.Lon, *q.Lat))
		}
	}
	return f
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// millis parses milliseconds since the Unix epoch (a JSON integer).
func millis(raw json.RawMessage) (time.Time, error) {
	if isNull(raw) {
		return time.Time{}, errors.New("missing")
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s is not an integer number of milliseconds", raw)
	}
	t := time.UnixMilli(n).UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, fmt.Errorf("%d ms is outside the years 0001 to 9999", n)
	}
	return t, nil
}

// text parses a JSON string, or a number as its JSON text (GeoJSON allows a
// numeric feature id); nil for null or absent.
func text(raw json.RawMessage) (*string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return &s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		s = n.String()
		return &s, nil
	}
	return nil, fmt.Errorf("%s is not a string", raw)
}

// number parses a JSON number; nil for null or absent.
func number(raw json.RawMessage) (*float64, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%s is not a number", raw)
	}
	return &v, nil
}

// integer parses a JSON integer; nil for null or absent.
func integer(raw json.RawMessage) (*int64, error) {
	if isNull(raw) {
		return nil, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s is not an integer", raw)
	}
	return &n, nil
}
