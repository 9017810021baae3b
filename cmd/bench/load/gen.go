package main

import "github.com/pgbackfill/backfill/cmd/bench/internal/orderlines"

// The target shape and its rows (package orderlines, shared with
// cmd/bench/rollback).
var (
	keyColumns    = orderlines.KeyColumns
	allColumns    = orderlines.AllColumns
	nonKeyColumns = orderlines.NonKeyColumns
)

// benchSchema holds the target tables of a benchmark database.
const benchSchema = "bench"

// createTargetSQL returns the DDL of an empty target table
// (orderlines.CreateTargetSQL).
func createTargetSQL(table string) string { return orderlines.CreateTargetSQL(table) }

// genRow writes the row of id into vals (orderlines.Row).
func genRow(id int64, vals []any, buf []byte) []byte { return orderlines.Row(id, vals, buf) }
