# LuffyMQ — the two commands a newcomer needs are `make run` and `make test`.

GO        ?= go
BIN       := bin
PKGS      := ./...
STATICCHECK_VERSION := v0.8.2

.PHONY: run build test test-short lint fmt deps fuzz bench soak demo-multisite clean bench-sites bench-sites-1x bench-sites-matrix

## run: build and start luffymq with defaults (MQTT 127.0.0.1:1883, HTTP 127.0.0.1:8080, strategy adaptive)
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
## FUZZMINIMIZETIME bounds the shrinking of each new input (Go's default, 60s, can take a whole run)
FUZZMINIMIZETIME ?= 5s
fuzz: export GOFLAGS += -fuzzminimizetime=$(FUZZMINIMIZETIME)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./clientsdk/report/
	$(GO) test -run '^$$' -fuzz '^FuzzVarint$$' -fuzztime $(FUZZTIME) ./clientsdk/report/
	$(GO) test -run '^$$' -fuzz '^FuzzConnRead$$' -fuzztime $(FUZZTIME) ./broker/pingreq/
	$(GO) test -run '^$$' -fuzz '^FuzzConnReadMalformedLength$$' -fuzztime $(FUZZTIME) ./broker/pingreq/
	$(GO) test -run '^$$' -fuzz '^FuzzHeldPacketsMatchPassthrough$$' -fuzztime $(FUZZTIME) ./broker/pingreq/
	$(GO) test -run '^$$' -fuzz '^FuzzPublishPacketID$$' -fuzztime $(FUZZTIME) ./broker/pingreq/
	$(GO) test -run '^$$' -fuzz '^FuzzTopicMapping$$' -fuzztime $(FUZZTIME) ./bridge/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigMessage$$' -fuzztime $(FUZZTIME) ./bridge/
	$(GO) test -run '^$$' -fuzz '^FuzzBridgeConfig$$' -fuzztime $(FUZZTIME) ./bridge/
	$(GO) test -run '^$$' -fuzz '^FuzzWorkPacket$$' -fuzztime $(FUZZTIME) ./bridge/
	$(GO) test -run '^$$' -fuzz '^FuzzLoadReport$$' -fuzztime $(FUZZTIME) ./hooks/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigFromArgs$$' -fuzztime $(FUZZTIME) ./broker/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigFile$$' -fuzztime $(FUZZTIME) ./broker/
	$(GO) test -run '^$$' -fuzz '^FuzzAuthFile$$' -fuzztime $(FUZZTIME) ./broker/
	$(GO) test -run '^$$' -fuzz '^FuzzSiteConfig$$' -fuzztime $(FUZZTIME) ./bridge/
	$(GO) test -run '^$$' -fuzz '^FuzzSitesFile$$' -fuzztime $(FUZZTIME) ./bridge/controller/

## bench: representative benchmarks (about 50-60 min on 2 cores) into bench/results/, then refresh docs/benchmarks.md
##   and the README's headline: thesis-2 with every subscriber kind (3 runs each, medians), thesis-1, step, join, an
##   uneven fleet of 20 (fleet-20-rho85, against jsq and the live oracle; 3 runs), throughput (3 runs, medians),
##   reliability and connections (10 000 idle connections, idling 90 s after their commands, 3 runs, medians)
BENCH_OUT     ?= bench/results
BENCH_SYSTEMS ?= adaptive,adaptive-hold,thesis,jsq,power-of-two,round-robin,mosquitto,live-oracle,oracle
BENCH_KINDS   ?= thesis-reporter,timer-reporter,receipt-reporter,paho-qos1-ackafter
BENCH_RUN      = ./$(BIN)/luffy-bench shared --luffymq $(BIN)/luffymq --out $(BENCH_OUT)
bench:
	$(GO) build -o $(BIN)/ ./cmd/luffymq ./cmd/luffy-bench
	$(BENCH_RUN) --scenario thesis-2 --duration 10s --repeat 3 --subscriber sdk --systems $(BENCH_SYSTEMS),mochi
	$(BENCH_RUN) --merge --scenario thesis-2 --duration 10s --repeat 3 --subscriber $(BENCH_KINDS) --systems $(BENCH_SYSTEMS)
	$(BENCH_RUN) --merge --scenario thesis-1 --duration 5s --repeat 3 --subscriber sdk --systems $(BENCH_SYSTEMS)
	$(BENCH_RUN) --merge --scenario step --scenario join --duration 14s --repeat 1 --subscriber sdk --systems $(BENCH_SYSTEMS)
	$(BENCH_RUN) --merge --scenario fleet-20-rho85 --duration 10s --repeat 3 --subscriber paho-qos1-ackafter,thesis-reporter --systems adaptive,thesis,jsq,power-of-two,live-oracle,oracle
	./$(BIN)/luffy-bench throughput --luffymq $(BIN)/luffymq --out $(BENCH_OUT) --repeat 3 --messages 10000 --fanout-messages 5000 --timeout 30s
	./$(BIN)/luffy-bench reliability --luffymq $(BIN)/luffymq --out $(BENCH_OUT) --burst-pending-writes 65536
	./$(BIN)/luffy-bench connections --luffymq $(BIN)/luffymq --out $(BENCH_OUT) --connections 10000 --repeat 3 --idle 90s
	./scripts/update-bench-readme.sh $(BENCH_OUT)/summary.md

## soak: bounded soak test, not part of test (30 min by default): the real luffymq with 2 000
##   connections in 20 shared groups, 500 msg/s of QoS 0 and 1, members leaving and crashing;
##   lost/duplicated counts, p99, RSS and goroutines over time into SOAK_OUT (soak.json,
##   summary.md, PNGs). SOAK_ARGS="--duration 3m --connections 500" shortens it.
SOAK_OUT  ?= bench/results/soak
SOAK_ARGS ?=
soak:
	$(GO) build -o $(BIN)/ ./cmd/luffymq ./cmd/luffy-bench
	./$(BIN)/luffy-bench soak --luffymq $(BIN)/luffymq --out $(SOAK_OUT) $(SOAK_ARGS)

## bench-sites: scenario set C across sites (docs/scenarios.md §C): 4 real RabbitMQ nodes joined by delayed
##   links, luffymq against queue/exchange federation full mesh, star, random placement, Cloud and
##   Cloud-DIST, time scaled 10x (about 10 min on 2 cores; needs rabbitmq-server, which make deps installs).
##   JSON, summary.md and PNGs into SITES_OUT. SITES_ARGS="--scenario ps-B --sites berlin,tunis" narrows it.
SITES_OUT  ?= bench/results/sites
SITES_ARGS ?=
bench-sites: deps
	$(GO) build -o $(BIN)/ ./cmd/luffymq ./cmd/luffy-bench ./cmd/luffy-controller
	./$(BIN)/luffy-bench sites --luffymq $(BIN)/luffymq --luffy-controller $(BIN)/luffy-controller --out $(SITES_OUT) $(SITES_ARGS)

## bench-sites-1x: wq-balanced at the thesis's own time scale (consumers take 1 s, producers 1 msg/s, 60 s of
##   publishing; about 6 min), where the WAN's delays are small against the service time: into SITES_1X_OUT.
SITES_1X_OUT ?= bench/results/sites-1x
bench-sites-1x: deps
	$(GO) build -o $(BIN)/ ./cmd/luffymq ./cmd/luffy-bench ./cmd/luffy-controller
	./$(BIN)/luffy-bench sites --luffymq $(BIN)/luffymq --luffy-controller $(BIN)/luffy-controller --out $(SITES_1X_OUT) \
		--scenario wq-balanced --service 1s --rate 1 --wq-duration 60s

## bench-sites-matrix: the work-queue scenarios (wq-balanced, wq-local) at time scales 1x, 3x and 10x on three
##   topologies (Tunis busy among 4 sites, Montreal busy among 4 with 3 consumers a site, Tokyo busy among 3),
##   luffymq (ring and nearest routing), the thesis's rule, queue federation and the cloud side by side, with issue
##   22's goals checked per cell (about 25 min per scenario and repeat on 2 cores): matrix.json, matrix.md and
##   PNGs into SITES_MATRIX_OUT. SITES_MATRIX_ARGS="--repeat 3 --scenario wq-balanced" changes it.
SITES_MATRIX_OUT  ?= bench/results/sites-matrix
SITES_MATRIX_ARGS ?=
bench-sites-matrix: deps
	$(GO) build -o $(BIN)/ ./cmd/luffymq ./cmd/luffy-bench
	./$(BIN)/luffy-bench sites-matrix --luffymq $(BIN)/luffymq --out $(SITES_MATRIX_OUT) $(SITES_MATRIX_ARGS)

## demo-multisite: three sites (real RabbitMQ nodes + luffymq each) joined over emulated WAN links
demo-multisite: deps
	$(GO) run ./examples/multisite

clean:
	rm -rf $(BIN)
