package backfill

import (
	"context"
	"encoding/json"
	"log/slog"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestTransientFaultWarningsNameTheirPurposeAndBatch: a connection cut
// under a transaction the library runs for a run (a heartbeat, the
// record of the worker's end) is logged as a transient fault that names
// what the transaction does (not the default "manifest transaction")
// and the run's batch.
func TestTransientFaultWarningsNameTheirPurposeAndBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, trigger string }{
		{"heartbeat", `SET heartbeat_at = now() WHERE worker_key = $1 AND finished_at IS NULL`},
		{"worker end", `finished_at = now(), state = 'finished'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := pgtest.NewURL(t)
			admin := sqlx.MustOpen("postgres", u)
			t.Cleanup(func() { _ = admin.Close() })
			_, err := admin.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
			require.NoError(t, err)
			pu, err := neturl.Parse(u)
			require.NoError(t, err)
			p := newCutProxy(t, pu.Host, tc.trigger, false)
			db := sqlx.MustOpen("postgres", p.url(t, u))
			t.Cleanup(func() { _ = db.Close() })
			logs := &syncBuffer{}
			r, err := New(db, &Config{WorkerID: "cut", HeartbeatInterval: 10 * time.Millisecond, StaleAfter: 10 * time.Second, RetryBackoff: 10 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), liveJob(func(Chunk) {
				if tc.name == "heartbeat" {
					// A chunk outlasts a heartbeat: the proxy cuts it.
					<-p.fired
				}
			}))
			require.NoError(t, err, "logs:\n%s", logs)
			require.True(t, p.hasFired(), "the proxy never saw %q", tc.trigger)
			faults := 0
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &m), line)
				if msg, _ := m["msg"].(string); !strings.Contains(msg, "transient fault") {
					continue
				}
				faults++
				require.NotEqual(t, "manifest transaction", m["what"], "a transient fault names its transaction's purpose: %s", line)
				require.NotEmpty(t, m["what"], line)
				require.EqualValues(t, rep.BatchID, m["batch_id"], "a transient fault of the run names its batch: %s", line)
			}
			require.NotZero(t, faults, "no transient fault logged; logs:\n%s", logs)
		})
	}
}
