package backfill

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/testwait"
)

// TestWorkSchemaDroppedMidRunCoherent: the manifest's schema dropped
// while Work's run has done chunks: exit 64, every error names the schema
// as missing (never "behind this library", never a bare "does not
// exist"), and the final line does not say that nothing was run.
func TestWorkSchemaDroppedMidRunCoherent(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	job := liveJob(func(c Chunk) {
		if c.Seq >= 2 {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	})
	var logs syncBuffer
	r := liveRunner(t, db, "dropped", &logs)
	done := make(chan ExitCode, 1)
	go func() { done <- Work(testwait.Context(t, "the worker"), r, job) }()
	testwait.Recv(t, "a chunk in flight", held)
	testwait.Until(t, "two chunks done", func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`) == nil && n >= 2
	})
	_, err := db.Exec(`DROP SCHEMA backfill CASCADE`)
	require.NoError(t, err)
	close(release)
	code := testwait.Recv(t, "the worker", done)
	require.Equal(t, ExitUsage, code)

	var final map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["level"] != "ERROR" && m["level"] != "WARN" {
			continue
		}
		require.NotContains(t, line, "behind this library", "a missing schema is not behind")
		if strings.Contains(line, "does not exist") {
			require.Contains(t, line, `manifest schema \"backfill\" is missing`, "the raw error is explained: %s", line)
		}
		if strings.HasPrefix(m["msg"].(string), "backfill worker:") {
			final = m
		}
	}
	require.NotNil(t, final, "the final line")
	require.Regexp(t, `[1-9][0-9]* chunks done in this call`, final["error"])
	require.NotContains(t, final["msg"], "nothing run")
	// A restart cannot resume a run whose record is gone: the line says so.
	require.NotContains(t, final["msg"], "restart to resume")
	require.Contains(t, final["msg"], "starts a new run")
	require.Contains(t, final["error"], `manifest schema "backfill" is missing`)
	require.Contains(t, final["error"], "backfill migrate")
}
