package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestCLIPlanApprove: plan prints the blueprint recorded for a run, as
// text and JSON, with the changes since the job's previous run; approve
// records an approval as an operator role, refusing a stale fingerprint
// and the author, and status shows the approvals.
func TestCLIPlanApprove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, db, b1, b2 := loadFares(t)

	var b backfill.Blueprint
	cliJSON(t, u, &b, "plan", "--batch", fmt.Sprint(b2))
	require.Equal(t, b2, b.BatchID)
	require.Equal(t, "fares", b.Job)
	require.Equal(t, 1, b.Scope.Chunks)
	require.Equal(t, b1, b.Previous.BatchID)
	require.Contains(t, b.Changes, `scope: "int [0, 3000) step 1000" -> "int [0, 1000) step 1000"`)
	require.Len(t, b.Modules, 1)
	require.Equal(t, []string{`backfill.CheckExceptionRate {"Severity":"warn","Name":"","MaxRate":0.001}`}, b.Modules[0].Jobs[0].Validators)
	out := cliOK(t, u, "plan", "fares")
	require.Contains(t, out, `Blueprint of job "fares"`)
	require.Contains(t, out, fmt.Sprintf("Changes since the previous plan (batch %d, completed, fingerprint ", b1))
	require.Regexp(t, `(?m)^  job\.fares\.rollback\.restores:\s+deletes the rows the run inserted`, out)
	require.Regexp(t, `(?m)^  fingerprint:\s+[0-9a-f]{64}$`, out)

	// A run awaiting one approval, not the author's.
	job := faresJob(1000, 3, true)
	job.Approval = backfill.ApprovalPolicy{Approvers: 1}
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true}) // returns while it awaits approval
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	b3 := rep.BatchID
	cliJSON(t, u, &b, "plan", "--batch", fmt.Sprint(b3))
	require.Equal(t, backfill.RunAwaitingApproval, b.Status)
	require.Equal(t, &backfill.ApprovalPolicy{Approvers: 1}, b.Approval)
	fp := b.Fingerprint

	code, _, errOut := cli(t, u, "approve", "--batch", fmt.Sprint(b3), "--fingerprint", fp)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--reason")
	// The CLI's role (the superuser here) started the run: the author.
	code, _, errOut = cli(t, u, "approve", "--batch", fmt.Sprint(b3), "--fingerprint", fp, "--reason", "mine", "--approver", "ann")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "is its author")

	// An operator role.
	rb := make([]byte, 5)
	_, _ = rand.Read(rb)
	role := "op_" + hex.EncodeToString(rb)
	_, err = db.Exec(`CREATE ROLE ` + role + ` LOGIN PASSWORD 'pw'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP OWNED BY ` + role); _, _ = db.Exec(`DROP ROLE ` + role) })
	for _, g := range backfill.NewPGManifest("").OperatorGrants(role) {
		_, err := db.Exec(g)
		require.NoError(t, err)
	}
	pu, err := neturl.Parse(u)
	require.NoError(t, err)
	pu.User = neturl.UserPassword(role, "pw")
	ou := pu.String()
	code, _, errOut = cli(t, ou, "approve", "--batch", fmt.Sprint(b3), "--fingerprint", "feedface", "--reason", "ok", "--approver", "bob")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "stale fingerprint 'feedface'")
	var res approveResult
	cliJSON(t, ou, &res, "approve", "--batch", fmt.Sprint(b3), "--fingerprint", fp, "--reason", "blueprint reviewed", "--approver", "bob")
	require.Equal(t, approveResult{BatchID: b3, Job: "fares", Fingerprint: fp, Approver: "bob", Reason: "blueprint reviewed",
		Status: backfill.RunRunning, Approvals: 1, Required: 1}, res)
	out = cliOK(t, u, "status", "--batch", fmt.Sprint(b3))
	require.Contains(t, out, "approvals 1 of 1 of plan fingerprint "+fp)
	require.Regexp(t, `by bob \(role `+role+`\): blueprint reviewed`, out)
	job.NewRun = false // NewRun would start (and await) another run
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, b3, rep.BatchID)
}
