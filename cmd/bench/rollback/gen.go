package main

import "github.com/pgbackfill/backfill/cmd/bench/internal/orderlines"

// The target shape and its rows: cmd/bench/load's (package orderlines).
var (
	keyColumns = orderlines.KeyColumns
	allColumns = orderlines.AllColumns
)

// createTargetSQL returns the DDL of an empty target table, with the
// lineage columns the undo log needs (orderlines.CreateTargetSQL).
func createTargetSQL(table string) string { return orderlines.CreateTargetSQL(table) }

// genRow writes the row of id into vals (orderlines.Row).
func genRow(id int64, vals []any, buf []byte) []byte { return orderlines.Row(id, vals, buf) }
