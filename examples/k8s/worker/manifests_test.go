package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/pgbackfill/backfill"
)

// manifestsDir holds the example's manifests, relative to this package.
const manifestsDir = "../manifests"

// The names the manifests use, which the tests hold them to.
const (
	workerJobName  = "backfill-demo-workers"
	migrateJobName = "backfill-migrate"
	workerName     = "worker"
	migrateName    = "migrate"
	configMapName  = "backfill-demo"
	sqlConfigMap   = "backfill-demo-sql"
	loaderSecret   = "backfill-loader"
	ownerSecret    = "backfill-owner"
	oncallSecret   = "backfill-oncall"
	loaderRole     = "backfill_loader"
	ownerRole      = "backfill_owner"
	operatorRole   = "backfill_operator"
)

// exitActions is what the worker Job does with each exit code of
// backfill.Work: the pod action of its podFailurePolicy ("" for ExitDone:
// a pod that exits 0 succeeded, and no rule may name 0). Keyed by the
// constants' names, so that a code added to the library without a
// decision here fails TestExitCodesAreAllMapped.
var exitActions = map[string]struct {
	code   backfill.ExitCode
	action batchv1.PodFailurePolicyAction
}{
	"ExitDone":      {backfill.ExitDone, ""},
	"ExitFailed":    {backfill.ExitFailed, batchv1.PodFailurePolicyActionFailJob},
	"ExitCancelled": {backfill.ExitCancelled, batchv1.PodFailurePolicyActionFailJob},
	"ExitUsage":     {backfill.ExitUsage, batchv1.PodFailurePolicyActionFailJob},
	"ExitTempFail":  {backfill.ExitTempFail, batchv1.PodFailurePolicyActionCount},
}

// object is one document of a manifest file, decoded strictly into its
// typed Kubernetes object.
type object struct {
	file string
	kind string
	name string
	obj  any
}

// docSep splits a file into its YAML documents.
var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// loadManifests decodes every document of every *.yaml file in dir
// strictly (an unknown or duplicate field is an error) into the typed
// object of its apiVersion and kind; a kind the example does not use is
// an error too.
func loadManifests(t *testing.T, dir string) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSep.Split(string(data), -1) {
			j, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
				continue // comments only
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var o any
			switch tm.APIVersion + " " + tm.Kind {
			case "batch/v1 Job":
				o = &batchv1.Job{}
			case "v1 ConfigMap":
				o = &corev1.ConfigMap{}
			case "v1 Secret":
				o = &corev1.Secret{}
			case "v1 Pod":
				o = &corev1.Pod{}
			default:
				t.Fatalf("%s document %d: apiVersion %q kind %q: not a kind this test knows", f, i, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, tm.Kind, err)
			}
			name := o.(metav1.ObjectMetaAccessor).GetObjectMeta().GetName()
			if name == "" {
				t.Fatalf("%s document %d (%s): no metadata.name", f, i, tm.Kind)
			}
			for _, p := range objs {
				if p.kind == tm.Kind && p.name == name {
					t.Fatalf("%s: %s %s is also in %s", f, tm.Kind, name, p.file)
				}
			}
			objs = append(objs, object{file: filepath.Base(f), kind: tm.Kind, name: name, obj: o})
		}
	}
	return objs
}

// find returns the object of kind and name, typed T.
func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			return o.obj.(T)
		}
	}
	t.Fatalf("no %s %s in %s", kind, name, manifestsDir)
	var zero T
	return zero
}

// container returns the container (or init container) of spec named name.
func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// policyAction is the action the Job's podFailurePolicy takes for a pod
// whose container exited with code and that has no condition: the first
// rule that matches, as the Job controller reads them; matched is false
// when none does (the failure is counted, as with Count).
func policyAction(p *batchv1.PodFailurePolicy, containerName string, code int32) (action batchv1.PodFailurePolicyAction, matched bool) {
	for _, r := range p.Rules {
		e := r.OnExitCodes
		if e == nil || (e.ContainerName != nil && *e.ContainerName != containerName) {
			continue
		}
		in := slices.Contains(e.Values, code)
		if (e.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn) == in {
			return r.Action, true
		}
	}
	return "", false
}

// checkPolicyValid checks what the API server's validation checks of a
// Job's podFailurePolicy, so that a manifest it would refuse fails here.
func checkPolicyValid(t *testing.T, job *batchv1.Job) {
	t.Helper()
	p, spec := job.Spec.PodFailurePolicy, job.Spec.Template.Spec
	if p == nil {
		return
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("Job %s: podFailurePolicy needs restartPolicy Never, not %q", job.Name, spec.RestartPolicy)
	}
	if job.Spec.PodReplacementPolicy != nil && *job.Spec.PodReplacementPolicy != batchv1.Failed {
		t.Errorf("Job %s: podFailurePolicy allows only podReplacementPolicy Failed", job.Name)
	}
	if len(p.Rules) > 20 {
		t.Errorf("Job %s: %d podFailurePolicy rules, at most 20", job.Name, len(p.Rules))
	}
	for i, r := range p.Rules {
		switch r.Action {
		case batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyActionIgnore, batchv1.PodFailurePolicyActionCount:
		case batchv1.PodFailurePolicyActionFailIndex:
			if job.Spec.BackoffLimitPerIndex == nil {
				t.Errorf("Job %s rule %d: FailIndex needs backoffLimitPerIndex", job.Name, i)
			}
		default:
			t.Errorf("Job %s rule %d: unknown action %q", job.Name, i, r.Action)
		}
		if (r.OnExitCodes == nil) == (len(r.OnPodConditions) == 0) {
			t.Errorf("Job %s rule %d: exactly one of onExitCodes and onPodConditions", job.Name, i)
		}
		if e := r.OnExitCodes; e != nil {
			if e.ContainerName != nil {
				container(t, spec, *e.ContainerName)
			}
			if e.Operator != batchv1.PodFailurePolicyOnExitCodesOpIn && e.Operator != batchv1.PodFailurePolicyOnExitCodesOpNotIn {
				t.Errorf("Job %s rule %d: operator %q", job.Name, i, e.Operator)
			}
			if len(e.Values) == 0 || len(e.Values) > 255 {
				t.Errorf("Job %s rule %d: %d values, want 1 to 255", job.Name, i, len(e.Values))
			}
			if !slices.IsSorted(e.Values) || len(slices.Compact(slices.Clone(e.Values))) != len(e.Values) {
				t.Errorf("Job %s rule %d: values %v must be ascending and unique", job.Name, i, e.Values)
			}
			if e.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && slices.Contains(e.Values, 0) {
				t.Errorf("Job %s rule %d: the In operator may not list 0", job.Name, i)
			}
		}
		for _, c := range r.OnPodConditions {
			if c.Type == "" || c.Status == "" {
				t.Errorf("Job %s rule %d: a pod condition needs type and status", job.Name, i)
			}
		}
	}
}

// TestManifestsParse decodes every manifest strictly and checks what the
// API server would refuse of the Jobs.
func TestManifestsParse(t *testing.T) {
	objs := loadManifests(t, manifestsDir)
	for _, o := range objs {
		if job, ok := o.obj.(*batchv1.Job); ok {
			checkPolicyValid(t, job)
			if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever && job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
				t.Errorf("Job %s: restartPolicy %q (a Job allows Never or OnFailure)", job.Name, job.Spec.Template.Spec.RestartPolicy)
			}
		}
	}
	t.Logf("%d objects decoded strictly from %s", len(objs), manifestsDir)
}

// TestExitCodesAreAllMapped: the worker Job's podFailurePolicy takes, for
// each exit code of backfill.Work, the action of exitActions, read from
// the library's constants (a renumbered code fails here), and exitActions
// names every ExitCode constant the library declares (a new one fails
// here until it is decided).
func TestExitCodesAreAllMapped(t *testing.T) {
	declared := exitCodeConstants(t, filepath.Join("..", "..", ".."))
	var mapped []string
	for name := range exitActions {
		mapped = append(mapped, name)
	}
	sort.Strings(mapped)
	if !slices.Equal(declared, mapped) {
		t.Fatalf("the library declares the exit codes %v; the worker Job decides %v: decide each code's pod action (exitActions, 03-worker-job.yaml, README)", declared, mapped)
	}

	job := find[*batchv1.Job](t, loadManifests(t, manifestsDir), "Job", workerJobName)
	p := job.Spec.PodFailurePolicy
	if p == nil {
		t.Fatal("the worker Job has no podFailurePolicy")
	}
	for _, name := range mapped {
		want := exitActions[name]
		got, matched := policyAction(p, workerName, int32(want.code))
		switch {
		case want.code == 0 && matched:
			t.Errorf("exit %d (%s) is success, yet rule action %s matches it", want.code, name, got)
		case want.code != 0 && !matched:
			t.Errorf("exit %d (%s): no rule matches; want %s", want.code, name, want.action)
		case got != want.action:
			t.Errorf("exit %d (%s): action %s, want %s", want.code, name, got, want.action)
		}
	}
	// Every code a rule names is one of the library's.
	for i, r := range p.Rules {
		if r.OnExitCodes == nil {
			continue
		}
		for _, v := range r.OnExitCodes.Values {
			known := false
			for _, a := range exitActions {
				known = known || int32(a.code) == v
			}
			if !known {
				t.Errorf("rule %d names exit code %d, which backfill.Work does not return", i, v)
			}
		}
	}
	// A pod disrupted (evicted, preempted, drained) is not the worker's
	// failure: SIGTERM makes it exit 75, or the grace period's SIGKILL
	// 137; neither may count, nor fail the Job.
	disrupted := -1
	for i, r := range p.Rules {
		for _, c := range r.OnPodConditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && r.Action == batchv1.PodFailurePolicyActionIgnore {
				disrupted = i
			}
		}
	}
	if disrupted < 0 {
		t.Error("no rule ignores a pod with the DisruptionTarget condition")
	}
	for i, r := range p.Rules[:max(disrupted, 0)] {
		if r.OnExitCodes != nil && slices.Contains(r.OnExitCodes.Values, int32(backfill.ExitTempFail)) {
			t.Errorf("rule %d takes exit %d before the DisruptionTarget rule: an evicted pod would count", i, backfill.ExitTempFail)
		}
	}
}

// exitCodeConstants returns the names of the constants of type ExitCode
// that the Go files of the package in dir declare, sorted.
func exitCodeConstants(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "ExitCode" {
					for _, n := range vs.Names {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no ExitCode constants found in %s", dir)
	}
	sort.Strings(names)
	return names
}

// TestWorkerJob checks the worker Job's shape: an Indexed Job whose pods
// restart only through the Job controller, stop within the library's
// shutdown bound, run as the loader from its Secret, and size their pool
// for the ConfigMap's concurrency.
func TestWorkerJob(t *testing.T) {
	objs := loadManifests(t, manifestsDir)
	job := find[*batchv1.Job](t, objs, "Job", workerJobName)
	spec := job.Spec.Template.Spec
	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion {
		t.Error("the worker Job is not Indexed")
	}
	if job.Spec.Completions == nil || job.Spec.Parallelism == nil || *job.Spec.Completions != *job.Spec.Parallelism || *job.Spec.Completions < 1 {
		t.Errorf("completions %v, parallelism %v: want N and N (every pod works until the run is done, then exits 0)", job.Spec.Completions, job.Spec.Parallelism)
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %q, want Never (podFailurePolicy decides from the exit code)", spec.RestartPolicy)
	}
	if job.Spec.PodReplacementPolicy == nil || *job.Spec.PodReplacementPolicy != batchv1.Failed {
		t.Error("podReplacementPolicy is not Failed: a replacement could work beside the pod it replaces")
	}
	if job.Spec.ActiveDeadlineSeconds != nil {
		t.Error("activeDeadlineSeconds would fail the Job during a long pause, while its workers wait as they should")
	}

	// The grace period covers the records of the shutdown retried for the
	// library's reconnect budget, 2 x StaleAfter ("Restarts" in the README).
	minGrace := 2*backfill.DefaultStaleAfter + 10*time.Second
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < minGrace {
		t.Errorf("terminationGracePeriodSeconds unset or below %v", minGrace)
	}

	w := container(t, spec, workerName)
	if w.LivenessProbe != nil || w.ReadinessProbe != nil || w.StartupProbe != nil {
		t.Error("the worker has a probe: liveness is the manifest's heartbeat (backfill.run_liveness), see the README")
	}
	if w.Resources.Requests.Cpu().IsZero() || w.Resources.Requests.Memory().IsZero() || w.Resources.Limits.Memory().IsZero() {
		t.Error("the worker requests no CPU or memory, or has no memory limit")
	}
	checkLeastPrivilege(t, objs, spec, w)

	// The ConfigMap sets only what the worker reads, and a valid setting.
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap", configMapName)
	known := []string{envJob, envTable, envIDs, envChunkRows, envConcurrency, envExtractDelay}
	for k := range cm.Data {
		if !slices.Contains(known, k) {
			t.Errorf("ConfigMap %s sets %s, which the worker does not read", configMapName, k)
		}
	}
	env := map[string]string{envDatabaseURL: "postgres://x@y/z"}
	for k, v := range cm.Data {
		env[k] = v
	}
	s, err := readSettings(func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", configMapName, err)
	}
	if !slices.ContainsFunc(w.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.ConfigMapRef != nil && e.ConfigMapRef.Name == configMapName
	}) {
		t.Errorf("the worker does not read ConfigMap %s", configMapName)
	}
	t.Logf("%d pods x Concurrency %d: %d connections per pod, %d in all; PgBouncer default_pool_size >= %d",
		*job.Spec.Parallelism, s.concurrency, poolSize(s.concurrency), int(*job.Spec.Parallelism)*poolSize(s.concurrency),
		int(*job.Spec.Parallelism)*s.concurrency+1)
}

// checkLeastPrivilege: the worker's DATABASE_URL comes from the loader's
// Secret, whose role is neither the owner nor a superuser, and no other
// credential reaches the pod.
func checkLeastPrivilege(t *testing.T, objs []object, spec corev1.PodSpec, w corev1.Container) {
	t.Helper()
	var dbURL *corev1.EnvVar
	for i, e := range w.Env {
		if e.Name == envDatabaseURL {
			dbURL = &w.Env[i]
		}
		if strings.Contains(e.Value, "://") || strings.Contains(strings.ToLower(e.Value), "password") {
			t.Errorf("env %s holds a literal credential; take it from a Secret", e.Name)
		}
	}
	if dbURL == nil || dbURL.ValueFrom == nil || dbURL.ValueFrom.SecretKeyRef == nil || dbURL.ValueFrom.SecretKeyRef.Name != loaderSecret {
		t.Fatalf("the worker's %s does not come from Secret %s", envDatabaseURL, loaderSecret)
	}
	for _, e := range w.EnvFrom {
		if e.SecretRef != nil {
			t.Errorf("the worker takes every key of Secret %s: name the one it needs", e.SecretRef.Name)
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil || v.Projected != nil {
			t.Errorf("volume %s mounts credentials into the worker", v.Name)
		}
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the worker mounts a service account token it does not need")
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the worker may run as root")
	}
	if user := secretUser(t, objs, loaderSecret, dbURL.ValueFrom.SecretKeyRef.Key); user != loaderRole {
		t.Errorf("Secret %s logs in as %q, want the loader %q", loaderSecret, user, loaderRole)
	}
}

// secretUser returns the user of the URL under key in the Secret.
func secretUser(t *testing.T, objs []object, name, key string) string {
	t.Helper()
	s := find[*corev1.Secret](t, objs, "Secret", name)
	raw, ok := s.StringData[key]
	if !ok {
		raw, ok = string(s.Data[key]), s.Data[key] != nil
	}
	if !ok {
		t.Fatalf("Secret %s has no key %s", name, key)
	}
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		t.Fatalf("Secret %s key %s: not a postgres:// URL with a user (%v)", name, key, err)
	}
	user := u.User.Username()
	if user == "postgres" || strings.Contains(user, "admin") || strings.Contains(user, "super") {
		t.Errorf("Secret %s logs in as %q, a superuser's name", name, user)
	}
	return user
}

// TestMigrateJob: the migrate Job runs as the owner, grants the loader the
// worker logs in as and the operator role, and runs the target's DDL of
// the ConfigMap before it.
func TestMigrateJob(t *testing.T) {
	objs := loadManifests(t, manifestsDir)
	job := find[*batchv1.Job](t, objs, "Job", migrateJobName)
	spec := job.Spec.Template.Spec
	m := container(t, spec, migrateName)
	want := []string{"migrate", "--grant", loaderRole, "--grant-operator", operatorRole}
	if !slices.Equal(m.Args, want) {
		t.Errorf("migrate args %q, want %q", m.Args, want)
	}
	if len(spec.InitContainers) != 1 || !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == sqlConfigMap
	}) {
		t.Error("the migrate Job does not run the target's DDL from ConfigMap " + sqlConfigMap + " first")
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		ref := envSecret(c, envDatabaseURL)
		if ref == nil || ref.Name != ownerSecret {
			t.Errorf("container %s of the migrate Job does not log in from Secret %s", c.Name, ownerSecret)
			continue
		}
		if user := secretUser(t, objs, ownerSecret, ref.Key); user != ownerRole {
			t.Errorf("Secret %s logs in as %q, want the owner %q", ownerSecret, user, ownerRole)
		}
	}
	sql := find[*corev1.ConfigMap](t, objs, "ConfigMap", sqlConfigMap).Data["target.sql"]
	if !strings.Contains(sql, "TO "+loaderRole) {
		t.Errorf("target.sql grants nothing to %s", loaderRole)
	}

	// The worker and the on-call pod run the migrate Job's image, and the
	// on-call pod logs in as neither the owner nor the loader.
	image := m.Image
	worker := find[*batchv1.Job](t, objs, "Job", workerJobName)
	if w := container(t, worker.Spec.Template.Spec, workerName); w.Image != image {
		t.Errorf("worker image %s, migrate image %s: one release of the library", w.Image, image)
	}
	pod := find[*corev1.Pod](t, objs, "Pod", "backfill-oncall")
	c := pod.Spec.Containers[0]
	if c.Image != image {
		t.Errorf("on-call image %s, migrate image %s", c.Image, image)
	}
	ref := envSecret(c, envDatabaseURL)
	if ref == nil || ref.Name != oncallSecret {
		t.Fatalf("the on-call pod does not log in from Secret %s", oncallSecret)
	}
	if user := secretUser(t, objs, oncallSecret, ref.Key); user == ownerRole || user == loaderRole {
		t.Errorf("the on-call pod logs in as %s; an operator is neither owner nor loader", user)
	}
}

// envSecret returns the Secret reference of c's variable name, or nil.
func envSecret(c corev1.Container, name string) *corev1.SecretKeySelector {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// TestReadSettings: a missing URL or a malformed number is refused.
func TestReadSettings(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, envDatabaseURL + " is not set"},
		{map[string]string{envDatabaseURL: "postgres://u@h/d", envConcurrency: "0"}, envConcurrency},
		{map[string]string{envDatabaseURL: "postgres://u@h/d", envIDs: "ten"}, envIDs},
		{map[string]string{envDatabaseURL: "postgres://u@h/d", envExtractDelay: "-1s"}, envExtractDelay},
	} {
		_, err := readSettings(func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.want)
		}
	}
	s, err := readSettings(func(k string) string { return map[string]string{envDatabaseURL: "postgres://u@h/d"}[k] })
	if err != nil || s.concurrency != 2 || s.ids != 1_000_000 || s.chunkRows != 10_000 || s.job != "k8s-demo" {
		t.Errorf("defaults %+v, %v", s, err)
	}
	if got := fmt.Sprint(poolSize(2)); got != strconv.Itoa(6) {
		t.Errorf("poolSize(2) = %s, want 6", got)
	}
}
