package backfillthrottle_test

import (
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
