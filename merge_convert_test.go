package backfill

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// TestTimeInfinityIsPgconvs: the exported sentinels are the instants the
// conversion writes as 'infinity' and '-infinity'.
func TestTimeInfinityIsPgconvs(t *testing.T) {
	t.Parallel()
	require.True(t, TimeInfinity.Equal(pgconv.Infinity))
	require.True(t, TimeNegInfinity.Equal(pgconv.NegInfinity))
	got, reason := pgstore.ConvertValue(Column{Name: "c", BaseType: "timestamptz"}, TimeInfinity)
	require.Empty(t, reason)
	require.Equal(t, "infinity", got)
	got, reason = pgstore.ConvertValue(Column{Name: "c", BaseType: "date"}, TimeNegInfinity)
	require.Empty(t, reason)
	require.Equal(t, "-infinity", got)
}

// TestColumnConvCopiesEveryField: each field of pgconv.Column is copied
// from the Column field of the same name, so that a field added there is
// not silently left zero.
func TestColumnConvCopiesEveryField(t *testing.T) {
	t.Parallel()
	c := Column{Name: "n", Type: "numeric(5,2)", BaseType: "numeric", MaxLen: 7, Precision: 5, Scale: 2, NotNull: true, Key: true}
	got := reflect.ValueOf(c.Conv())
	src := reflect.ValueOf(c)
	for i := range got.NumField() {
		name := got.Type().Field(i).Name
		f := src.FieldByName(name)
		require.True(t, f.IsValid(), "Column has no field %s", name)
		require.False(t, f.IsZero(), "test value of %s is zero", name)
		require.Equal(t, f.Interface(), got.Field(i).Interface(), name)
	}
}
