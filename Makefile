# Targets for developers and CI (.ci/run calls `make test`).
#
# examples/ (and examples/k8s, whose test needs the Kubernetes API types),
# cmd/backfill (the operator's command) and contrib/<name> (the
# adapters with heavy dependencies) are modules of their own; test and lint
# cover them too.
#
# Tests need PostgreSQL: with DATABASE_URL unset, each test binary starts a
# throwaway server of its own through internal/pgtest (TestMain calls
# pgtest.Main), from the PostgreSQL binaries installed on the machine.

GO ?= go
# staticcheck 2026.2.2 (v0.8.2) supports go1.26.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test lint

# SUBMODULES: the modules of their own inside this repository (examples/,
# examples/<name> (the Kubernetes example, examples/k8s),
# cmd/backfill, contrib/<name>); test and lint cover each of them.
SUBMODULES = $(patsubst %/go.mod,%,$(wildcard examples/go.mod examples/*/go.mod cmd/*/go.mod contrib/*/go.mod))

# The first line of test says which of the machine's components the tests
# need were found (.ci/components), and which tests are skipped for lack
# of the others; BACKFILL_REQUIRE_<NAME>=1 (as .ci/run sets) fails them
# instead.
#
# A hung test fails on its own deadline (internal/pgtest: 8 minutes per
# test; internal/testwait: 2 minutes per wait), naming itself; the package
# timeout is only a backstop, long enough for the root package on a
# loaded 2-core machine (it took 15 minutes beside other test suites).
TEST_TIMEOUT ?= 30m

# TEST_PARALLEL: how many parallel tests (t.Parallel) of a package of the
# root module run at once (go test -parallel; Go's default is GOMAXPROCS,
# 2 on a 2-core machine). The tests mostly wait on PostgreSQL, child
# processes and timers rather than use the CPU, so more of them at once
# than cores shortens the run.
TEST_PARALLEL ?= 6

# The root module's tests and the submodules' (vet and tests, one module
# after another) run as two streams at once: the root module's output as it
# comes, the submodules' kept in a file and printed after it, so that
# neither interleaves with the other. Every submodule is tested even after
# one fails; make test fails if anything failed, and its last lines say
# where.
test:
	@bash .ci/components
	$(GO) vet ./...
	@log=$$(mktemp); \
	( fails=""; \
	  for m in $(SUBMODULES); do \
		echo "== $$m: $(GO) vet ./... && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./..."; \
		(cd $$m && $(GO) vet ./... && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...) || fails="$$fails $$m"; \
	  done; \
	  if [ -n "$$fails" ]; then echo "make test: FAILED in submodule(s):$$fails"; exit 1; fi \
	) >"$$log" 2>&1 & sub=$$!; \
	echo "$(GO) test -count=1 -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) ./...   (submodules tested meanwhile: $(SUBMODULES))"; \
	$(GO) test -count=1 -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) ./...; root=$$?; \
	wait $$sub; subrc=$$?; \
	echo "== submodules, tested while the root module's tests ran:"; cat "$$log"; rm -f "$$log"; \
	if [ $$root -ne 0 ]; then echo "make test: FAILED in the root module (go test ./... above)"; fi; \
	[ $$root -eq 0 ] && [ $$subrc -eq 0 ]

# test-faults: the fault suite (internal/faulttest, build tag faults):
# worker processes on simulated hosts (network namespaces as root, else
# loopback) under kill -9, SIGSTOP, network cuts, server restarts,
# PgBouncer, COMMITs cut and max_connections used up; prints a summary.
# BACKFILL_FAULTS_SEED replays a seed.
.PHONY: test-faults
test-faults:
	$(GO) test -tags faults -count=1 -timeout 20m -v ./internal/faulttest/...

lint:
	@out=$$(gofmt -l .); if test -n "$$out"; then \
		echo "gofmt: these files need formatting (gofmt -w):"; echo "$$out"; exit 1; \
	fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	for m in $(SUBMODULES); do \
		(cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...) || exit 1; \
	done

# demo: the main job, the flights example (examples/flights/README.md).
# Fetches the data once, then runs against DATABASE_URL or a throwaway
# server. Extra flags: make demo ARGS='-limit-days 7'. BACKFILL_KEEP=1 make
# demo keeps the throwaway server afterwards for inspection (Ctrl-C stops it).
# BACKFILL_DURABLE=1 make demo starts it with production durability (fsync,
# full_page_writes, synchronous_commit on), its files on disk (the system's
# temporary directory, never /dev/shm, where fsync costs nothing);
# PGTEST_TMPDIR=DIR puts a server's files in DIR.
ARGS ?=

.PHONY: demo data
demo: data
	bash internal/pgtest/with-postgres.sh sh -c 'cd examples && $(GO) run ./flights $(ARGS)'

# data: fetch flights-3m.parquet and airports.csv (npm pack vega-datasets@3.2.1).
data:
	bash examples/flights/fetch-data.sh

# demo-temporal: the flights job through contrib/temporal's workflow
# (Temporal's Go test suite in this process, no Temporal server): 2 worker
# slots, the first attempt of one a worker process killed with SIGKILL in
# the middle of a day, Temporal retrying it; checks that its target equals a
# plain run's (examples/flights/temporal_test.go). The whole file by
# default; make demo-temporal DAYS=14 for its first 14 days.
DAYS ?= 0

.PHONY: demo-temporal
demo-temporal: data
	bash internal/pgtest/with-postgres.sh sh -c 'cd examples && FLIGHTS_TEMPORAL_DATA="$$PWD/flights/data/flights-3m.parquet" FLIGHTS_TEMPORAL_DAYS=$(DAYS) $(GO) test -count=1 -timeout 20m -run "^TestFlightsThroughTemporal$$" -v ./flights'

# bench: the load benchmark (cmd/bench/load/README.md): every variant a
# whole process timed from exec to exit, the library's defaults against a
# hand-written chunked load and the other variants, 3 rounds alternating,
# on a throwaway fast server and a throwaway durable one; then the Go
# benchmarks if the module has any. No assertions: both only report.
# Quicker: make bench BENCHLOAD_FLAGS='-rows 300000'; one server:
# BENCHLOAD_FLAGS='-servers durable'.
BENCHLOAD_FLAGS ?=

.PHONY: bench bench-lock bench-probe bench-control bench-status bench-status-scale bench-plan
bench:
	$(GO) run ./cmd/bench/load $(BENCHLOAD_FLAGS)
	@if grep -rqs --include='*_test.go' '^func Benchmark' . ; then \
		echo "$(GO) test -run '^$$' -bench . -benchtime 1x ./..."; \
		$(GO) test -run '^$$' -bench . -benchtime 1x ./...; \
	else \
		echo "bench: no Go benchmarks (func BenchmarkXxx) in the module; skipping go test -bench"; \
	fi

# bench-lock: a backfill beside pgbench on a durable server (fsync and
# synchronous_commit on) while a session locks the target ACCESS EXCLUSIVE
# for 30 s (cmd/bench/lock/README.md). Reports only. Extra flags:
# make bench-lock BENCHLOCK_FLAGS='-lock 10s -v'
BENCHLOCK_FLAGS ?=

bench-lock:
	$(GO) run ./cmd/bench/lock $(BENCHLOCK_FLAGS)

# bench-probe: pgbench alone, beside a backfill, and beside a backfill
# throttled by the recommended latency goal (LatencyGoal, rise 0.3), on a
# durable server (cmd/bench/probe/README.md). Reports only. Extra flags:
# make bench-probe BENCHPROBE_FLAGS='-runs 5' (a summary against the bars)
BENCHPROBE_FLAGS ?=

bench-probe:
	$(GO) run ./cmd/bench/probe $(BENCHPROBE_FLAGS)

# bench-control: a pause issued from SQL against 3 worker processes, 20
# times: the time until every worker of every process stopped (p50, p99,
# max), then one cancel, checking every chunk is done or pending
# (cmd/bench/control). Reports only. Extra flags: make bench-control
# BENCHCONTROL_FLAGS='-trials 50 -listen=false'
BENCHCONTROL_FLAGS ?=

bench-control:
	$(GO) run ./cmd/bench/control $(BENCHCONTROL_FLAGS)

# bench-status: the ETA of Status: a generic job with chunks of varying
# sizes, held by an injected SQL throttle for part of the run; prints
# Status's ETA at 25%, 50% and 75% of the rows against the time that
# actually remained (cmd/bench/status). Reports only. Extra flags:
# make bench-status BENCHSTATUS_FLAGS='-chunks 200 -throttle-for 30s -v'
BENCHSTATUS_FLAGS ?=

bench-status:
	$(GO) run ./cmd/bench/status $(BENCHSTATUS_FLAGS)

# bench-status-scale: the operator reads (Runner.Status, the data load of
# backfill status, the Prometheus scrape's JobChunks, the report's
# LoadRunReport) of a run of 100,000 and 1,000,000 chunks with 0, 10,000
# and 1,000,000 queued exceptions, inserted in bulk: median, min and max
# wall time and the median CPU time of the server's backend and of the
# client (cmd/bench/statusscale/README.md). Reports only. Extra flags:
# make bench-status-scale BENCHSTATUSSCALE_FLAGS='-chunks 100000 -reps 31 -cli ./backfill'
BENCHSTATUSSCALE_FLAGS ?=

bench-status-scale:
	$(GO) run ./cmd/bench/statusscale $(BENCHSTATUSSCALE_FLAGS)

# bench-rollback: Runner.Rollback against the batch it withdraws (a first
# load, an update-heavy restatement, a mixed batch) on the load
# benchmark's order-line table: time and WAL of each (cmd/bench/rollback).
# Reports only. Extra flags: make bench-rollback
# BENCHROLLBACK_FLAGS='-rows 300000 -runs 1 -durable'
BENCHROLLBACK_FLAGS ?=
.PHONY: bench-rollback
bench-rollback:
	$(GO) run ./cmd/bench/rollback $(BENCHROLLBACK_FLAGS)

# bench-plan: a plan of 1,000,000 IntRange chunks on a durable server:
# time to the first extraction, time per claimed chunk, peak Go heap and
# peak RSS while planning and claiming, then resuming in a new Runner
# (cmd/bench/plan). Reports only. Extra flags: make bench-plan
# BENCHPLAN_FLAGS='-chunks 200000 -claims 500 -server-profile'
BENCHPLAN_FLAGS ?=

bench-plan:
	$(GO) run ./cmd/bench/plan $(BENCHPLAN_FLAGS)
