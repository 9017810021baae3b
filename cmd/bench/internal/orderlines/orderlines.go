// Package orderlines generates the benchmarks' order-line rows: a pure
// function of the row id, so that any chunk can be generated alone, in
// any process, and every variant receives the same Go values.
package orderlines

import (
	"fmt"
	"strconv"
	"time"
)

// The target shape: a realistic order-line table with a composite business
// key (KeyColumns) and six non-key columns of common types; AllColumns in
// table order, the order of Row's values.
var (
	KeyColumns = []string{"source_system", "order_no", "line_no"}
	AllColumns = []string{"source_system", "order_no", "line_no",
		"product_code", "description", "quantity", "unit_price", "ordered_at", "is_returned"}
	NonKeyColumns = AllColumns[len(KeyColumns):]
)

// CreateTargetSQL returns the DDL of an empty target table of 11 columns:
// the nine data columns and the library's default lineage columns, so that
// a job that leaves Rollback unset gets the library's default rollback
// mechanism (the undo log, which writes lineage on every row). Library and
// baseline load identical tables; the baseline leaves lineage NULL.
func CreateTargetSQL(table string) string {
	return fmt.Sprintf(`CREATE TABLE %s (
	source_system text NOT NULL,
	order_no bigint NOT NULL,
	line_no int NOT NULL,
	product_code varchar(20) NOT NULL,
	description text,
	quantity int NOT NULL,
	unit_price numeric(12,2) NOT NULL,
	ordered_at timestamptz NOT NULL,
	is_returned bool NOT NULL,
	backfill_inserted_by bigint,
	backfill_updated_by bigint,
	PRIMARY KEY (source_system, order_no, line_no))`, table)
}

var (
	systems = [...]string{"erp-eu", "erp-us", "erp-apac"}
	words   = [...]string{"bolt", "washer", "bracket", "hinge", "gasket", "spring", "valve", "flange", "sprocket", "bearing", "coupling", "sensor"}
	colours = [...]string{"black", "zinc-plated", "stainless", "brass", "red", "anodised blue"}
	epoch   = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
)

// splitmix64 is a stateless 64-bit mixer (Steele, Lea, Flood 2014): the
// generator is a pure function of the row id, so any chunk can be generated
// alone, in any process, and always yields the same rows.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Row writes the row of id into vals (len(AllColumns) values, in
// AllColumns order). Both variants receive exactly these Go values: string,
// int64, int, string, string or nil, int, string (numeric as decimal text),
// time.Time (UTC) and bool. buf is scratch space reused between calls.
func Row(id int64, vals []any, buf []byte) []byte {
	h := splitmix64(uint64(id))
	order := id / 8
	vals[0] = systems[order%int64(len(systems))]
	vals[1] = 1_000_000_000 + order
	vals[2] = int(id%8) + 1

	buf = append(buf[:0], "SKU-"...)
	buf = strconv.AppendUint(buf, 100000+h%900000, 10)
	buf = append(buf, '-', byte('A'+(h>>20)%26))
	vals[3] = string(buf)

	if h%17 != 0 { // about 6% NULL descriptions
		buf = append(buf[:0], words[(h>>24)%uint64(len(words))]...)
		buf = append(buf, ' ')
		buf = strconv.AppendUint(buf, (h>>28)%1000, 10)
		buf = append(buf, " mm, "...)
		buf = append(buf, colours[(h>>36)%uint64(len(colours))]...)
		vals[4] = string(buf)
	} else {
		vals[4] = nil
	}
	vals[5] = int(1 + (h>>40)%250)

	cents := (h >> 8) % 5_000_000 // up to 49,999.99
	buf = strconv.AppendUint(buf[:0], cents/100, 10)
	buf = append(buf, '.', byte('0'+cents%100/10), byte('0'+cents%10))
	vals[6] = string(buf)

	// Microsecond precision, like timestamptz: what is written is what is read.
	vals[7] = epoch.Add(time.Duration(id)*37*time.Second + time.Duration((h>>12)%1_000_000)*time.Microsecond)
	vals[8] = (h>>48)%29 == 0
	return buf
}
