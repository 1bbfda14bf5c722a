# memarts — see README.md. `make demo` and `make test` are the quick start.
CARGO ?= cargo
PYTHON ?= python3
export CARGO_TERM_COLOR ?= never

.PHONY: all build install install-bin uninstall test unit e2e lint fmt demo bench clean deps-build deps-test reliability

all: build

build: deps-build
	$(CARGO) build --release --bins

# `memarts` and `memarts-proxy` into $(PREFIX)/bin (memarts finds memarts-proxy next to itself), and
# the Python package (`import memarts`) into $(PYTHON)'s environment. PREFIX=$$HOME/.local installs
# without root; DESTDIR stages a package. `install-bin` installs the binaries of BIN_DIR only, built
# or not (the install test uses it with the debug build).
PREFIX ?= /usr/local
BIN_DIR ?= target/release
install: build install-bin
	$(PYTHON) -m pip install --quiet --disable-pip-version-check ./shim/python
	@echo "installed the Python package memarts into $$($(PYTHON) -c 'import sys; print(sys.prefix)')"

install-bin:
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN_DIR)/memarts $(BIN_DIR)/memarts-proxy $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 ops/scripts/memarts-recover.sh $(DESTDIR)$(PREFIX)/bin/memarts-recover
	@echo "installed $(DESTDIR)$(PREFIX)/bin/memarts, memarts-proxy and memarts-recover (the recovery script)"
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) ;; *) echo "note: $(PREFIX)/bin is not on PATH: add it, or run $(PREFIX)/bin/memarts";; esac

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/memarts $(DESTDIR)$(PREFIX)/bin/memarts-proxy $(DESTDIR)$(PREFIX)/bin/memarts-recover
	-$(PYTHON) -m pip uninstall --quiet --yes memarts

# What building needs beyond Rust: protoc (Debian package protobuf-compiler), which generates the etcd
# client's code of the proxy's `etcd` feature (on by default) at build time.
deps-build:
	@command -v protoc >/dev/null || { echo "installing protoc (the etcd client is generated at build time)"; \
		(apt-get update -qq && apt-get install -y -qq protobuf-compiler) >/dev/null || { echo "cannot install protoc: install it (apt-get install protobuf-compiler)" >&2; exit 1; }; }

# Everything the tests need beyond Rust: etcd and etcdctl, strace, fuse3 and systemd (Debian packages), a real S3-protocol server (moto) on loopback, pytest, the
# libraries of the MoXing usage examples (numpy, Pillow, scipy, OpenCV, torch), torch for the
# DataLoader and checkpoint tests, fsspec, pandas and pyarrow for memarts.fsspec's,
# prometheus_client, whose OpenMetrics parser reads what the metrics endpoint serves, and
# kubernetes-validate, which checks the Kubernetes manifests in ops/ against the API's schemas.
# torch from PyPI brings its CUDA libraries: ~4 GB, ~90 s here.
PY_TEST_DEPS = 'moto[server]>=5.1' pytest numpy pillow scipy opencv-python-headless torch fsspec pandas pyarrow prometheus_client kubernetes-validate
deps-test: deps-build
	@command -v etcd >/dev/null && command -v etcdctl >/dev/null || { echo "installing etcd and etcdctl (the etcd membership tests run a real one on loopback and write to it)"; \
		(apt-get update -qq && apt-get install -y -qq etcd-server etcd-client) >/dev/null || { echo "cannot install etcd: install it (apt-get install etcd-server etcd-client)" >&2; exit 1; }; }
	@command -v strace >/dev/null || { echo "installing strace (the D1/S1 tests read system call order from it)"; \
		(apt-get update -qq && apt-get install -y -qq strace) >/dev/null || { echo "cannot install strace: install it (apt-get install strace)" >&2; exit 1; }; }
	@command -v systemd-analyze >/dev/null || { echo "installing systemd (systemd-analyze verify checks the unit in ops/systemd)"; \
		(apt-get update -qq && apt-get install -y -qq systemd) >/dev/null || { echo "cannot install systemd: install it (apt-get install systemd)" >&2; exit 1; }; }
	@command -v fusermount3 >/dev/null || { echo "installing fuse3 (fusermount3: the memarts mount tests mount and unmount real FUSE file systems)"; \
		(apt-get update -qq && apt-get install -y -qq fuse3) >/dev/null || { echo "cannot install fuse3: install it (apt-get install fuse3)" >&2; exit 1; }; }
	@$(PYTHON) -c "import moto.server, pytest, numpy, PIL, scipy, cv2, torch, fsspec, pandas, pyarrow, prometheus_client, kubernetes_validate" 2>/dev/null || \
		$(PYTHON) -m pip install --quiet --disable-pip-version-check $(PY_TEST_DEPS)

# The deployment files in ops/ checked by the tools that read them (ops/scripts/check-deploy.sh), then
# unit, property, golden and end-to-end tests (the e2e tests start moto and real proxy processes; they
# run a second time on the pread engine, which takes over where containers refuse io_uring), then the
# Python package built by maturin and its tests, against a real fleet and again with the
# engine embedded in the test process (USE_MEMARTS=1, no fleet).
# Each test command runs with a private TMPDIR, removed after it (ops/scripts/in-private-tmp.sh):
# nothing the tests make is left in /tmp.
IN_TMP = ops/scripts/in-private-tmp.sh
test: deps-test
	$(CARGO) build --bins
	ops/scripts/check-deploy.sh $(CURDIR)/target/debug
	$(IN_TMP) $(CARGO) test --workspace
	MEMARTS_IO_ENGINE=pread $(IN_TMP) $(CARGO) test --test e2e
	$(PYTHON) -m pip install --quiet --disable-pip-version-check ./shim/python
	MEMARTS_BIN_DIR=$(CURDIR)/target/debug $(IN_TMP) $(PYTHON) -m pytest -q shim/python/tests
	MEMARTS_TEST_MODE=embedded MEMARTS_BIN_DIR=$(CURDIR)/target/debug $(IN_TMP) $(PYTHON) -m pytest -q shim/python/tests

# rustfmt, clippy and rustdoc (broken intra-doc links and the like), all with warnings as errors.
lint: deps-build
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --quiet

fmt:
	$(CARGO) fmt --all

# A fleet over a generated sample dataset on a local origin: cold read, warm read, warm after restart.
demo: build
	bash ops/scripts/demo.sh target/release

# One run, all figures side by side (BENCH_SCALE=small: under 5 minutes): cold reads against the
# emulated link's capacity on an s3s-fs origin (link.json; tests/bench/origin, s3s-fs with GET bodies read whole and
# LISTs of the prefix's directory only, is built into target/bench-tools once), the Rust bench (fleet.json), warm reads with local hits against local
# files (warm.json), the Python package (python.json), memarts against the tools users pick instead
# over an emulated remote link (compare.json; the peers are pip-installed by the script), a cluster
# pool of 3 nodes against 3 independent fleets over one shared emulated link (cluster.json), a warm
# epoch in the field after the metadata TTL from the SSD against download-then-read (field.json),
# millions of small objects on a local origin: fill against cp -r, memory, disk and restart per object,
# a warm epoch against the files (small_objects.json),
# `memarts mount` against local files and the s3fs / rclone mounts (mount.json; Debian packages);
# then report.py merges them into tests/bench/results/latest.{json,md,svg} and docs_figures.py writes
# the figures of the README and docs/ from them. The cold reads over the
# link run first: the other benchmarks delete many files at their ends, and for a few minutes after
# that ext4 makes every file creation scan past the recently deleted inodes, which a fresh cache's
# fills would pay for.
# The commit measured, taken when make starts (a commit made during the run does not change it).
BENCH_COMMIT := $(shell git describe --always --dirty --abbrev=7 2>/dev/null)
bench: deps-test build
	$(CARGO) build --release --bins --benches
	$(PYTHON) -m pip install --quiet --disable-pip-version-check ./shim/python matplotlib
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/link_bench.py
	$(CARGO) bench -p memarts-tests --bench fleet
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/warm_bench.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/python_bench.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/compare.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/stream_bench.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/cluster_bench.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/field_bench.py
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/small_objects_bench.py
	@for peer in s3fs rclone; do command -v $$peer >/dev/null || { echo "installing $$peer (the mount benchmark compares memarts mount with it)"; \
		(apt-get update -qq && apt-get install -y -qq $$peer) >/dev/null || echo "cannot install $$peer: the mount benchmark reports it as unavailable" >&2; }; done
	MEMARTS_BIN_DIR=$(CURDIR)/target/release $(PYTHON) tests/bench/mount_bench.py
	BENCH_COMMIT=$(BENCH_COMMIT) $(PYTHON) tests/bench/report.py
	$(PYTHON) tests/bench/docs_figures.py

# The reliability campaign (under 15 minutes here): coverage-guided fuzzing of every decoder
# (ops/scripts/fuzz.sh, FUZZ_SECONDS per target), then every fault class of docs/RELIABILITY.md against a
# real fleet with clients verifying every byte; prints the table and writes
# tests/reliability/results/latest.{json,md}, then the README's table and docs/RELIABILITY.md's totals
# from them (docs_table.py). A short version runs in `make test`.
FUZZ_SECONDS ?= 45
reliability: deps-test
	$(CARGO) build --release --bins
	bash ops/scripts/fuzz.sh $(FUZZ_SECONDS)
	RELIABILITY_SCALE=full $(CARGO) test --release --test reliability
	$(PYTHON) tests/reliability/docs_table.py

clean:
	$(CARGO) clean
