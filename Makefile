# Targets for developers and CI (.ci/run calls `make test`).
#
# Tests need PostgreSQL: with DATABASE_URL unset, each test binary starts a
# throwaway server of its own through internal/pgtest (TestMain calls
# pgtest.Main), from the PostgreSQL binaries installed on the machine.

GO ?= go
# staticcheck 2026.2.2 (v0.8.2) supports go1.26.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test lint

test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 15m ./...
	if test -f examples/go.mod; then \
		cd examples && $(GO) vet ./... && $(GO) test -count=1 -timeout 15m ./...; \
	fi

lint:
	@out=$$(gofmt -l .); if test -n "$$out"; then \
		echo "gofmt: these files need formatting (gofmt -w):"; echo "$$out"; exit 1; \
	fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	if test -f examples/go.mod; then \
		cd examples && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...; \
	fi

# demo, data, bench: defined by their owners below.
