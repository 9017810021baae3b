package backfill_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// approvalSetup is a test database with the items table, its migrated
// manifest, the superuser's connection (admin: the author of the runs)
// and its URL.
type approvalSetup struct {
	*itemsSetup
	url string
}

func newApprovalSetup(t *testing.T) *approvalSetup {
	t.Helper()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(`CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	require.NoError(t, backfill.NewPGManifest("").Init(context.Background(), db))
	return &approvalSetup{itemsSetup: &itemsSetup{db: db}, url: url}
}

// operator creates a login role granted as an operator
// (PGManifest.OperatorGrants) and returns its name and connection.
func (s *approvalSetup) operator(t *testing.T, prefix string) (string, *sqlx.DB) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := prefix + "_" + hex.EncodeToString(b)
	_, err := s.db.Exec(`CREATE ROLE ` + name + ` LOGIN PASSWORD 'pw'`)
	require.NoError(t, err)
	for _, g := range backfill.NewPGManifest("").OperatorGrants(name) {
		_, err := s.db.Exec(g)
		require.NoError(t, err, g)
	}
	u, err := neturl.Parse(s.url)
	require.NoError(t, err)
	u.User = neturl.UserPassword(name, "pw")
	db := sqlx.MustOpen("postgres", u.String())
	t.Cleanup(func() {
		_ = db.Close()
		_, _ = s.db.Exec(`DROP OWNED BY ` + name)
		_, _ = s.db.Exec(`DROP ROLE ` + name)
	})
	return name, db
}

// itemsChecksum is the checksum of the items table's rows.
func itemsChecksum(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	var sum string
	require.NoError(t, db.Get(&sum, `SELECT coalesce(md5(string_agg(i::text, ',' ORDER BY tenant, id)), 'empty') FROM items i`))
	return sum
}

// touchedChunks counts the chunks of batch leased, attempted or not pending.
func touchedChunks(t *testing.T, db *sqlx.DB, batch int64) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1
		AND (status <> 'pending' OR lease_key IS NOT NULL OR lease_epoch <> 0 OR leased_at IS NOT NULL OR attempts <> 0)`, batch))
	return n
}

func approvalEvents(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.events WHERE kind = 'approval_recorded'`))
	return n
}

// TestApprovalFlow: a job whose policy needs two approvers, not the
// author, starts awaiting approval: Run writes nothing to the target and
// leases no chunk, and says what is missing and how to approve. The
// refusals (a stale fingerprint, the author, the same approver twice by
// name or by role) record nothing. Two approvals by two operator roles
// set the run running; a call waiting for it (Run's default) then
// completes the run. Status shows the approvals; the audit log records
// each with its database role.
func TestApprovalFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	job := s.job(1)
	job.Approval = backfill.ApprovalPolicy{Approvers: 2}
	author, err := backfill.New(s.db, &backfill.Config{WorkerID: "author-worker", ReturnOnPause: true})
	require.NoError(t, err)

	before := itemsChecksum(t, s.db)
	rep, err := author.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	require.Equal(t, backfill.RunAwaitingApproval, rep.Status)
	batch := rep.BatchID
	var fp string
	require.NoError(t, s.db.Get(&fp, `SELECT plan_fingerprint FROM backfill.runs WHERE batch_id = $1`, batch))
	require.ErrorContains(t, err, "0 of 2 approvals of plan fingerprint "+fp)
	require.ErrorContains(t, err, "backfill approve --batch")
	require.ErrorContains(t, err, "--fingerprint "+fp)
	// Again: still nothing.
	_, err = author.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	require.Equal(t, before, itemsChecksum(t, s.db), "nothing written to the target")
	require.Zero(t, touchedChunks(t, s.db, batch), "no chunk leased")
	var policy string
	require.NoError(t, s.db.Get(&policy, `SELECT plan->>'approval' FROM backfill.runs WHERE batch_id = $1`, batch))
	require.JSONEq(t, `{"approvers": 2}`, policy, "the policy is SQL-visible in the plan")

	// A call that waits for the approvals.
	waiter, err := backfill.New(s.db, &backfill.Config{ThrottleInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	type result struct {
		rep backfill.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := waiter.Run(ctx, job)
		done <- result{rep, err}
	}()

	aliceRole, aliceDB := s.operator(t, "alice")
	bobRole, bobDB := s.operator(t, "bob")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	bob, err := backfill.New(bobDB, nil)
	require.NoError(t, err)

	// Refusals, each recording nothing.
	err = alice.Approve(ctx, batch, "0123abcd", "alice", "looks right")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "stale fingerprint '0123abcd'")
	require.ErrorContains(t, err, "the run's plan has fingerprint "+fp)
	err = author.Approve(ctx, batch, fp, "carol", "I wrote it")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "is its author")
	err = alice.Approve(ctx, batch, fp, "author-worker", "by the author's name")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "'author-worker' (role "+aliceRole+") is its author")
	require.Zero(t, approvalEvents(t, s.db))

	require.NoError(t, alice.Approve(ctx, batch, fp, "alice", "reviewed the blueprint"))
	err = alice.Approve(ctx, batch, fp, "alice", "again")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "the same approver twice")
	err = alice.Approve(ctx, batch, fp, "alice's colleague", "same role, other name")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "the same approver twice")
	err = bob.Approve(ctx, batch, fp, "alice", "other role, same name")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.Equal(t, 1, approvalEvents(t, s.db))

	st, err := author.StatusOf(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, backfill.RunAwaitingApproval, st.Status)
	require.NotNil(t, st.Approval)
	require.Len(t, st.Approval.Approvals, 1)
	require.Equal(t, "alice", st.Approval.Approvals[0].Approver)
	require.Equal(t, aliceRole, st.Approval.Approvals[0].DBRole)
	require.Equal(t, "author-worker", st.Approval.Author)
	require.Equal(t, 1, st.Approval.Missing())
	require.Contains(t, st.Waiting, "1 of 2 approvals")
	require.Equal(t, before, itemsChecksum(t, s.db))
	require.Zero(t, touchedChunks(t, s.db, batch))

	require.NoError(t, bob.Approve(ctx, batch, fp, "bob", "checked the fallback path"))
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, backfill.RunCompleted, res.rep.Status)
	require.Equal(t, batch, res.rep.BatchID)
	var n int
	require.NoError(t, s.db.Get(&n, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, n)

	var roles []string
	require.NoError(t, s.db.Select(&roles, `SELECT db_role || ':' || actor || ':' || (detail->>'to') FROM backfill.events
		WHERE batch_id = $1 AND kind = 'approval_recorded' ORDER BY id`, batch))
	require.Equal(t, []string{aliceRole + ":alice:awaiting_approval", bobRole + ":bob:running"}, roles)

	// A completed run awaits nothing.
	err = bob.Approve(ctx, batch, fp, "bob2", "late")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorIs(t, err, backfill.ErrRunStatus)
}

// TestApprovalPlanChange: a changed plan is a new run with a new
// fingerprint; the approvals of the old one do not carry over, and an
// approval of the old fingerprint is refused as stale. A loader cannot
// record an approval through record_event.
func TestApprovalPlanChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	job := s.job(1)
	job.Approval = backfill.ApprovalPolicy{Approvers: 1}
	author, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := author.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	old := rep.BatchID
	var oldFP string
	require.NoError(t, s.db.Get(&oldFP, `SELECT plan_fingerprint FROM backfill.runs WHERE batch_id = $1`, old))

	// The policy is part of the plan.
	changed := job
	changed.Approval.Approvers = 2
	_, err = author.Run(ctx, changed)
	require.ErrorIs(t, err, backfill.ErrPlanChanged)
	require.ErrorContains(t, err, `approval.approvers: "1" -> "2"`)

	changed = job
	changed.CodeVersion = "v2"
	changed.NewRun = true
	rep, err = author.Run(ctx, changed)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	require.NotEqual(t, old, rep.BatchID)
	_, aliceDB := s.operator(t, "alice")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	err = alice.Approve(ctx, rep.BatchID, oldFP, "alice", "approved last week")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "stale fingerprint")
	err = alice.Approve(ctx, old, oldFP, "alice", "the abandoned one")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "it is abandoned")

	// A forged approval through the loader's record_event.
	_, err = s.db.Exec(`SELECT backfill.record_event($1, 'items', 'approval_recorded', 'mallory', '{}')`, rep.BatchID)
	require.ErrorContains(t, err, "recorded only by the control functions")
	require.Zero(t, approvalEvents(t, s.db))

	var newFP string
	require.NoError(t, s.db.Get(&newFP, `SELECT plan_fingerprint FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.NoError(t, alice.Approve(ctx, rep.BatchID, newFP, "alice", "ok"))
	rep, err = author.Run(ctx, changed2(changed))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
}

// changed2 is job resumed (no new run).
func changed2(job backfill.Job) backfill.Job {
	job.NewRun = false
	return job
}

// TestApprovalNeedsApprovals: a job with an approval policy on a manifest
// without approvals (the fakes) is refused before any run exists, and
// so is a negative number of approvers.
func TestApprovalNeedsApprovals(t *testing.T) {
	t.Parallel()
	m := backfilltest.NewMerger()
	m.AddTable("items", []string{"tenant", "id"}, "tenant", "id", "name", "amount", "seen_at")
	man := backfilltest.NewManifest()
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m})
	require.NoError(t, err)
	job := (&itemsSetup{}).job(1)
	job.Rollback = backfill.RollbackNone
	job.Approval = backfill.ApprovalPolicy{Approvers: 1}
	_, err = r.Blueprint(t.Context(), job)
	require.ErrorIs(t, err, backfill.ErrUnsupported, "the blueprint checks what Run checks")
	_, err = r.Run(t.Context(), job)
	require.ErrorIs(t, err, backfill.ErrUnsupported)
	require.ErrorContains(t, err, "Job.Approval")
	_, err = man.LatestRun(t.Context(), backfilltest.NewDB(), "items")
	require.ErrorIs(t, err, backfill.ErrRunNotFound)
	job.Approval.Approvers = -1
	_, err = r.Run(t.Context(), job)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "Job.Approval.Approvers -1")
	require.Error(t, r.Approve(t.Context(), 1, "fp", "ann", "why"))
}

// TestRunChunkAwaitingApproval: an engine's RunChunk on a run awaiting
// approval reports run_paused (try again), not run_ended (which an engine
// takes as "never"), and loads the chunk once the plan is approved.
func TestRunChunkAwaitingApproval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	job := s.job(1)
	job.Approval = backfill.ApprovalPolicy{Approvers: 1}
	r, err := backfill.New(s.db, &backfill.Config{WorkerID: "engine"})
	require.NoError(t, err)
	tx, err := s.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	pr, err := r.StartRunTx(ctx, tx, job)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, backfill.RunAwaitingApproval, pr.Status)
	rep, err := r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: pr.Chunks[0].Chunk.Seq})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkRunPaused, rep.Outcome, "awaiting approval is a wait, not an end")
	require.Contains(t, rep.Reason, "approval")

	var fp string
	require.NoError(t, s.db.Get(&fp, `SELECT plan_fingerprint FROM backfill.runs WHERE batch_id = $1`, pr.BatchID))
	_, aliceDB := s.operator(t, "alice")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	require.NoError(t, alice.Approve(ctx, pr.BatchID, fp, "alice", "reviewed"))
	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: pr.Chunks[0].Chunk.Seq})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkLoaded, rep.Outcome)
}
