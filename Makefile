# LuffyMQ — the two commands a newcomer needs are `make run` and `make test`.

GO        ?= go
BIN       := bin
PKGS      := ./...
STATICCHECK_VERSION := v0.8.2

.PHONY: run build test test-short lint fmt deps fuzz bench clean

## run: build and start luffymq with defaults (MQTT :1883, HTTP 127.0.0.1:8080, strategy adaptive)
run: build
	./$(BIN)/luffymq $(ARGS)

## build: build every command into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## deps: install what the tests need (Debian packages via apt-get, Go modules)
deps:
	./scripts/ensure-deps.sh

## test: install dependencies, check formatting and vet, run every test with the race detector
test: deps
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) test -race -timeout 12m $(PKGS)

## test-short: unit tests only, no servers
test-short:
	$(GO) test -short $(PKGS)

## lint: gofmt, go vet and staticcheck
lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)

## fmt: format the code
fmt:
	gofmt -w .

## fuzz: run every fuzz target for FUZZTIME each (default 30s)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./clientsdk/report/
	$(GO) test -run '^$$' -fuzz '^FuzzConnRead$$' -fuzztime $(FUZZTIME) ./broker/pingreq/

clean:
	rm -rf $(BIN)
