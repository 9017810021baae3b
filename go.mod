module github.com/pgbackfill/backfill

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/jmoiron/sqlx v1.4.0 // indirect
	github.com/lib/pq v1.12.3 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sync v0.25.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
