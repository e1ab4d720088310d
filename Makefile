# tollgate: the two commands of the README's quick start, and a few helpers.
#   make run    build (release) and run tollgate on conf/tollgate.yaml
#   make test   the whole test suite: lint, unit, integration, promtool checks
CONFIG ?= conf/tollgate.yaml

.PHONY: run test deps lint bench e2e check

deps:
	@scripts/deps.sh

run: deps
	cargo run --release -- run --config $(CONFIG)

check: deps
	cargo run --release -- check --config $(CONFIG)

lint: deps
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

test: lint
	cargo test --all-targets
	cargo test --doc

bench: deps
	cargo bench --bench limiters

e2e: deps
	benches/e2e.sh
