package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"

	"github.com/pgbackfill/backfill"
)

type airportRecorder struct{ got []string }

func (r *airportRecorder) Write(ctx context.Context, v ...any) error {
	r.got = append(r.got, fmt.Sprintf("write %v", v))
	return nil
}

func (r *airportRecorder) Reject(ctx context.Context, raw any, column, reason string) error {
	r.got = append(r.got, fmt.Sprintf("reject line %v %s: %s", raw.(map[string]any)["line"], column, reason))
	return nil
}

func TestAirportsExtract(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "airports.csv")
	csv := "iata,name,city,state,country,latitude,longitude\n" +
		"00M,Thigpen,Bay Springs,MS,USA,31.95376472,-89.23450472\n" +
		"35A,\"Union County, Troy Shelton\",Union,SC,USA,34.68680111,-81.64121167\n" +
		"YAP,Yap International,NA,NA,Federated States of Micronesia,9.5167,138.1\n" +
		",No Code,X,XX,USA,1,2\n" +
		"BAD,Bad Latitude,X,XX,USA,north,2\n" +
		"SHO,Short Row,X\n"
	if err := os.WriteFile(path, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	chunks, err := backfill.List("airports.csv").Chunks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := &airportRecorder{}
	if err := (Airports{Path: path}).Extract(context.Background(), chunks[0], r); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"write [00M Thigpen Bay Springs MS USA 31.95376472 -89.23450472]",
		"write [35A Union County, Troy Shelton Union SC USA 34.68680111 -81.64121167]",
		"write [YAP Yap International <nil> <nil> Federated States of Micronesia 9.5167 138.1]",
		"reject line 5 iata: cannot derive key: iata is empty",
		"reject line 6 latitude: not a number",
		"reject line 7 : 3 fields, want 7",
	}
	if diff := cmp.Diff(want, r.got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if err := (Airports{Path: path}).Extract(context.Background(), backfill.Chunk{ID: "list:other.csv", Kind: backfilltype.KindList, Item: "other.csv"}, r); err == nil {
		t.Error("chunk of another file: no error")
	}
}
