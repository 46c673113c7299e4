# osprey's entry points. CMake + Ninja do the building; this file only strings the steps together.
#
#   make run        set up, fetch the default model, build (Release) and generate a short completion
#   make test       set up, fetch the model, build, run every test (ctest)
#   make test-asan  the same tests in a separate ASan+UBSan build (build-asan/)
#   make fuzz       clang + libFuzzer build (build-fuzz/), each target for FUZZ_SECONDS on its seeds
#   make install    build, then install bin/osprey, lib/libosprey.a, include/osprey/*.h and
#                   lib/pkgconfig/osprey.pc under PREFIX (default /usr/local; cmake/install.cmake)
#   make test-gpu   the GPU tests (label gpu). On a GPU machine that has the binaries scripts/gpu-pack.sh
#                   staged in .carry/ (the lent H200, where nothing can be installed) it runs those (no
#                   setup step); elsewhere it builds and runs ctest -L gpu (they skip without a device)
#
# Variables: WERROR=ON (warnings are errors, as in CI), JOBS (build and ctest parallelism),
# FUZZ_SECONDS, PROMPT, N_TOKENS, CMAKE_ARGS (extra -D flags for every configure), PREFIX (make install).

JOBS         ?= 2
WERROR       ?= OFF
FUZZ_SECONDS ?= 60
CMAKE_ARGS   ?=
# Extra ctest arguments for test-asan, e.g. ASAN_CTEST_ARGS="-LE golden" to leave out the
# whole-model golden tests locally (CI runs them: ~2 min of CPU since the kernels keep vectorizing).
ASAN_CTEST_ARGS ?=
MODEL        ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT       ?= The three primary colors are
N_TOKENS     ?= 64
PREFIX       ?= /usr/local

CMAKE_COMMON := -G Ninja -DOSPREY_WERROR=$(WERROR) $(CMAKE_ARGS)
FUZZ_TARGETS  = $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all setup fetch build build-asan build-fuzz run test test-asan test-gpu fuzz clean install

all: build

setup:
	@bash scripts/setup.sh

fetch: setup
	@bash scripts/fetch-model.sh

# Configure every time (cheap when nothing changed) so WERROR/CMAKE_ARGS changes take effect.
build: setup
	cmake -S . -B build $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j $(JOBS)

# clang: its ASan keeps the kernels' vector loops vectorized (gcc's ASan does not, ~15x slower).
build-asan: setup
	CC=clang cmake -S . -B build-asan $(CMAKE_COMMON) -DCMAKE_C_COMPILER=clang \
	    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSPREY_SANITIZE=ON -DOSPREY_CUDA=OFF
	cmake --build build-asan -j $(JOBS)

build-fuzz: setup
	CC=clang cmake -S . -B build-fuzz $(CMAKE_COMMON) -DCMAKE_C_COMPILER=clang \
	    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSPREY_FUZZ=ON -DOSPREY_CUDA=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all

install: build
	cmake --install build --prefix $(PREFIX)

run: build fetch
	build/bin/osprey generate -m $(MODEL) -p "$(PROMPT)" -n $(N_TOKENS) --temp 0

test: build fetch
	ctest --test-dir build --output-on-failure --no-tests=error -j $(JOBS)

test-gpu:
	@if [ -f .carry/gpu.tar.xz ] && nvidia-smi -L >/dev/null 2>&1; then \
	    bash scripts/gpu-test.sh all; \
	else \
	    $(MAKE) build fetch && ctest --test-dir build --output-on-failure -L gpu; \
	fi

# Every test, golden ones included: with clang's ASan and UBSan off in the kernels (CMakeLists.txt)
# the whole-model golden tests cost ~2 min of CPU here instead of ~20, and the tokenizer golden test
# is the widest ASan check of the string code there is.
test-asan: build-asan fetch
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    ctest --test-dir build-asan --output-on-failure --no-tests=error -j $(JOBS) $(ASAN_CTEST_ARGS)

# Each target fuzzes for FUZZ_SECONDS, starting from its committed seeds (tests/fuzz/corpus/<name>/);
# new inputs go to build-fuzz/corpus/<name>/ so the committed corpus stays as it is, and crash
# reproducers to build-fuzz/artifacts/.
# Every target runs even if an earlier one crashed; the failures are listed at the end.
fuzz: build-fuzz
	@failed=""; for t in $(FUZZ_TARGETS); do \
	    c=$${t#fuzz_}; mkdir -p build-fuzz/corpus/$$c build-fuzz/artifacts; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	    build-fuzz/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	        -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/$$t- \
	        build-fuzz/corpus/$$c tests/fuzz/corpus/$$c || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then \
	    echo "fuzz: FAILED:$$failed (reproducers: build-fuzz/artifacts/)"; ls build-fuzz/artifacts; exit 1; \
	fi; echo "fuzz: all targets clean"

clean:
	rm -rf build build-asan build-fuzz
