# bigbatch — build, test, sanitizers, fuzzing, demo.
#
#   make            build bin/bigbatch and lib/libbigbatch.a
#   make check      the fast loop: build, then every suite but the slow ones (MPI, two hosts, Hugging Face,
#                   the browser's report) in parallel, on the CPU and the emulated GPUs; no installs, no network
#   make test       install missing Debian packages, build, run every Criterion suite
#   make demo       the main job: verify the embedded data/kjv, train a BPE tokenizer on the KJV text, pack it,
#                   train the gpt ~3 min (val loss in bits per byte), sample words, report
#   make asan|tsan  the test suites under AddressSanitizer+UBSan / ThreadSanitizer
#   make cuda-emu   the CUDA backend on emulated GPUs (tests/cuda_emu): build/cuda-emu/bin/bigbatch
#                   and build/cuda-emu/tests/test_cuda; `make test` builds and runs it
#   make fuzz       libFuzzer target for the shard reader (clang); FUZZ_SECONDS=600 make fuzz-run
#   make deps       install the Debian packages the build and tests need
#   make docs       refresh the README's outputs from real runs (make readme-output) and docs/report.png
#
# Variables: CUDA=auto|0|1|emu (auto: use nvcc when found; emu: the .cu sources as C++ on
# emulated GPUs, a test build), MPI=auto|0|1 (auto: use mpicc when found), OPT (-O3 -g), ARCH
# (-march=native), CUDA_GENCODE (sm_90 and sm_80 machine code, and compute_90 PTX that a newer
# GPU's driver compiles), NCCL_INC/NCCL_LIB (default
# the toolkit's), BUILD (object directory).

CC        ?= gcc
CUDA      ?= auto
OPT       ?= -O3 -g
ARCH      ?= -march=native
BUILD     ?= build/release
BIN_DIR   ?= bin
LIB_DIR   ?= lib
SAN       ?=

CXX       ?= g++
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
CUDA_GENCODE ?= -gencode=arch=compute_90,code=[sm_90,compute_90] -gencode=arch=compute_80,code=sm_80
# NCCL ships with the toolkit here; elsewhere (e.g. PyTorch's wheel) point these at it.
NCCL_INC  ?= $(CUDA_HOME)/include
NCCL_LIB  ?= $(CUDA_HOME)/lib64
# The cuDNN frontend (header-only, from PyPI's nvidia-cudnn-frontend; make deps fetches it):
# with it the CUDA build's bf16 attention runs on cuDNN's fused SDPA, loaded with dlopen.
CUDNN_FE_VERSION := 1.32.0
CUDNN_FE_INC ?= build/deps/cudnn-frontend-$(CUDNN_FE_VERSION)/include
CUDNN_FE_H   := $(wildcard $(CUDNN_FE_INC)/cudnn_frontend.h)

# MPI=auto|0|1 (auto: when mpicc is found): multi-process training under
# mpirun/srun (src/world/world.c); without it the binary refuses a launch
# of several processes.
MPI       ?= auto
MPICC     ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),auto)
  USE_MPI := $(if $(MPICC),1,0)
else
  USE_MPI := $(MPI)
endif

ifeq ($(CUDA),auto)
  USE_CUDA := $(if $(NVCC),1,0)
else
  USE_CUDA := $(CUDA)
endif
ifeq ($(filter $(USE_CUDA),0 1 emu),)
  $(error CUDA=$(CUDA): say auto, 0, 1 or emu)
endif
ifeq ($(USE_CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found; install the CUDA toolkit or set NVCC=/path/to/nvcc)
  endif
endif

PKGS      := liburing libzstd libxxhash zlib openblas jansson libpcre2-8 libcurl
DEB_PKGS  := build-essential pkg-config liburing-dev libzstd-dev libxxhash-dev zlib1g-dev libjansson-dev libpcre2-dev \
             libcriterion-dev libopenblas-dev libdnnl-dev zstd bible-kjv python3 python3-pip python3-venv python3-torch clang \
             openmpi-bin libopenmpi-dev chromium iproute2 \
             libcurl4-openssl-dev nginx-light python3-boto3 python3-flask python3-flask-cors python3-werkzeug \
             python3-xmltodict python3-responses python3-jinja2 python3-cryptography python3-dateutil python3-yaml
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

SAN_FLAGS := $(if $(SAN),-fsanitize=$(SAN) -fno-omit-frame-pointer,)
# Option tables list leading fields and leave the rest zero on purpose.
# No code here reads floating-point exception flags or errno from libm, and
# without those two the compiler vectorizes the CPU ops' loops (clamps, exp).
CFLAGS    := -std=gnu11 $(OPT) $(ARCH) -fno-trapping-math -fno-math-errno \
             -Wall -Wextra -Werror -Wno-missing-field-initializers \
             -Iinclude -Isrc -D_GNU_SOURCE \
             -MMD -MP $(SAN_FLAGS) $(PKG_CFLAGS) $(EXTRA_CFLAGS)
# oneDNN (Debian's libdnnl-dev, no .pc file): the CPU's bf16 products; its OpenMP runtime is libgomp.
LDLIBS    := $(PKG_LIBS) -ldnnl -lgomp -lm -lpthread
LDFLAGS   := $(SAN_FLAGS)

SRC       := $(wildcard src/core/*.c src/queue/*.c src/data/*.c src/backend/*.c src/backend/cuda/*.c src/model/*.c \
             src/trace/*.c src/optim/*.c src/train/*.c src/plan/*.c src/world/*.c src/report/*.c)
CLI_SRC   := $(wildcard src/cli/*.c)
CU_SRC    := $(wildcard kernels/*.cu src/backend/cuda/*.cu src/train/*.cu)
ifeq ($(USE_CUDA),1)
  SRC     := $(filter-out src/backend/cuda/cuda_none.c src/train/nccl_none.c,$(SRC))
  CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
  # Static runtime, no -lcuda: the binary loads where no GPU driver exists.
  # cuBLAS (and cuBLASLt) has no static build here: the rpath finds it in the toolkit,
  # which a CUDA build needs at run time (not a driver). NCCL is not linked:
  # the multi-GPU reducer loads it with dlopen, first through this rpath.
  CFLAGS  += -DBB_NVTX -isystem $(CUDA_HOME)/include
  LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -Wl,-rpath,$(NCCL_LIB) -lcudart_static -ldl -lrt -lstdc++
endif
# The emulated CUDA build (tests/cuda_emu): the same .cu sources compiled as
# C++ against the emulator's headers, linked with its runtime (cuBLAS on
# OpenBLAS inside), which points the reducer at its own libnccl.so.2. No
# toolkit is needed; the binaries find the libraries in ../lib.
EMU_DIR   := tests/cuda_emu
EMU_LIBS  := $(LIB_DIR)/libbbcudaemu.so $(LIB_DIR)/libnccl.so.2
ifeq ($(USE_CUDA),emu)
  SRC     := $(filter-out src/backend/cuda/cuda_none.c src/train/nccl_none.c,$(SRC))
  CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
  CFLAGS  += -DBB_CUDA_EMU -I$(EMU_DIR)/include
  LDLIBS  += -L$(LIB_DIR) -lbbcudaemu -Wl,-rpath,'$$ORIGIN/../lib' -ldl -lstdc++
  EMU_DEPS := $(EMU_LIBS)
endif
ifeq ($(USE_MPI),1)
  ifeq ($(MPICC),)
    $(error MPI=1 but mpicc was not found; make deps installs Open MPI)
  endif
  CFLAGS  += -DBB_MPI $(shell $(MPICC) --showme:compile)
  LDLIBS  += $(shell $(MPICC) --showme:link)
endif
OBJ       := $(SRC:%.c=$(BUILD)/%.o) $(CU_OBJ)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
LIB       := $(LIB_DIR)/libbigbatch.a
BIN       := $(BIN_DIR)/bigbatch

TEST_SRC  ?= $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_LIBS := $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)

.PHONY: FORCE all test check check-tests check-layers cuda-emu cuda-emu-build cuda-emu-test cuda-emu-check demo deps report-screenshot readme-output docs asan tsan tsan-run fuzz fuzz-run clean data-kjv data-fmnist gpu-bundle hf-deps hf-deps-fetch s3-deps s3-deps-fetch
.DELETE_ON_ERROR:

all: $(BIN) $(LIB)

# Objects depend on the Makefile too: a change of flags rebuilds them.
$(BUILD)/%.o: %.c Makefile
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

ifeq ($(USE_CUDA),emu)
$(BUILD)/%.o: %.cu Makefile
	@mkdir -p $(@D)
	$(CXX) -x c++ -std=c++17 $(OPT) $(ARCH) -fno-gnu-unique -DBB_CUDA_EMU -I$(EMU_DIR)/include -Iinclude -Isrc -Ikernels \
	  -Wall -Wextra -Werror -Wno-missing-field-initializers -MMD -MP $(SAN_FLAGS) $(EXTRA_CFLAGS) -c $< -o $@
else
NVCC_COMPILE = $(NVCC) -std=c++17 -O2 $(CUDA_GENCODE) -Iinclude -Isrc -Ikernels -isystem $(NCCL_INC) $(NVCC_EXTRA) \
               -Xcompiler -Wall,-Wextra,-Werror,-fno-gnu-unique -MMD -MP -c $< -o $@
$(BUILD)/%.o: %.cu Makefile
	@mkdir -p $(@D)
	$(NVCC_COMPILE)
# The graph code where the frontend's headers are (rebuilt when they appear);
# without them the build says what that costs on a GPU.
ifneq ($(CUDNN_FE_H),)
$(BUILD)/src/backend/cuda/cudnn_attention.o: NVCC_EXTRA = -DBB_CUDNN_FRONTEND -isystem $(CUDNN_FE_INC)
$(BUILD)/src/backend/cuda/cudnn_attention.o: $(CUDNN_FE_H)
else
$(BUILD)/src/backend/cuda/cudnn_attention.o: src/backend/cuda/cudnn_attention.cu Makefile
	@mkdir -p $(@D)
	@echo "note: no cuDNN frontend headers in $(CUDNN_FE_INC) (make deps fetches them): on a GPU this build's" \
	      "bf16 attention runs on bigbatch's own kernels, far slower than cuDNN's (the train banner says which runs)"
	$(NVCC_COMPILE)
endif
endif

# The emulator's runtime (with cuBLAS; a library the binaries load at start,
# so its thread-locals are initial-exec) and its NCCL, which the reducer dlopens.
EMU_CXXFLAGS = -std=c++17 $(OPT) $(ARCH) -fPIC -fvisibility=hidden -Wall -Wextra -Werror -I$(EMU_DIR)/include \
               $(shell pkg-config --cflags openblas 2>/dev/null) $(SAN_FLAGS) $(EXTRA_CFLAGS)
EMU_RUNTIME := $(addprefix $(EMU_DIR)/,runtime.cpp emu_api.cpp memory.cpp streams.cpp kernels.cpp graphs.cpp cublas.cpp)
$(LIB_DIR)/libbbcudaemu.so: $(EMU_RUNTIME) $(EMU_DIR)/emu.h $(wildcard $(EMU_DIR)/include/*.h) Makefile
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) -ftls-model=initial-exec -shared -Wl,-soname,libbbcudaemu.so $(EMU_RUNTIME) \
	  $(shell pkg-config --libs openblas 2>/dev/null) -ldl -lpthread $(LDFLAGS) -o $@
$(LIB_DIR)/libnccl.so.2: $(EMU_DIR)/nccl.cpp $(LIB_DIR)/libbbcudaemu.so $(wildcard $(EMU_DIR)/include/*.h) Makefile
	$(CXX) $(EMU_CXXFLAGS) -shared -Wl,-soname,libnccl.so.2 $< -L$(LIB_DIR) -lbbcudaemu -Wl,-rpath,'$$ORIGIN' \
	  -lpthread $(LDFLAGS) -o $@

# The commit the binary reports (bb_commit): the header is rewritten only
# when it changes, so only version.o rebuilds.
COMMIT_H := $(BUILD)/gen/bb_commit.h
$(COMMIT_H): FORCE
	@mkdir -p $(@D); c=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown); \
	  git diff --quiet HEAD -- 2>/dev/null || c="$$c+"; \
	  echo "#define BB_COMMIT \"$$c\"" > $@.tmp; cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
$(BUILD)/src/core/version.o: $(COMMIT_H)
$(BUILD)/src/core/version.o: CFLAGS += -I$(BUILD)/gen
FORCE:

# The stamp changes when CUDA=0/1 switches in the same BUILD, so the library
# is re-archived without (or with) the CUDA objects.
CUDA_STAMP := $(BUILD)/cuda-$(USE_CUDA)-mpi-$(USE_MPI).stamp
$(CUDA_STAMP):
	@mkdir -p $(@D) && rm -f $(BUILD)/cuda-*.stamp && touch $@
$(BUILD)/src/world/world.o: $(CUDA_STAMP)

# The library is one relocatable object whose only global symbols are
# bb_*: what nvcc (kernel stubs, anonymous namespaces, CUB) and the
# header-only NVTX make global stays inside, and a user's program never
# meets a name of ours without the prefix.
$(BUILD)/bigbatch.o: $(OBJ) $(CUDA_STAMP)
	ld -r -o $@.tmp $(OBJ) && objcopy --wildcard --keep-global-symbol='bb_*' $@.tmp $@ && rm -f $@.tmp

$(LIB): $(BUILD)/bigbatch.o
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $<

$(BIN): $(CLI_OBJ) $(LIB) $(EMU_DEPS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(LIB) $(EMU_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -Isrc $< $(TEST_OBJS) $(LIB) $(TEST_LIBS) $(LDLIBS) $(TEST_LDLIBS) $(LDFLAGS) -o $@
# The emulator's own suite, in the emulated build: its kernels, and its NCCL called directly.
ifeq ($(USE_CUDA),emu)
$(BUILD)/tests/test_cuda_emu: TEST_OBJS = $(BUILD)/tests/cuda_emu/selftest.o
$(BUILD)/tests/test_cuda_emu: $(BUILD)/tests/cuda_emu/selftest.o
$(BUILD)/tests/test_cuda_emu: TEST_LDLIBS = -L$(LIB_DIR) -l:libnccl.so.2
endif

# Runs the suites of TEST_SRC in parallel (tests/run_suites.sh: JOBS suites
# at once, the CPUs by default); the tests find the CLI through
# BIGBATCH_BIN. Passing tests stay quiet; skipped ones are listed with
# their reason.
SHELL := /bin/bash
check-tests: $(TEST_BIN) $(BIN)
	@tests/run_suites.sh $(abspath $(BIN)) $(TEST_BIN)

# The layering rule of ARCHITECTURE.md (Modules), by grep.
check-layers:
	@tests/check_layers.sh

# The fast loop: no installs, no network, the slow suites left to make test.
CHECK_SLOW := tests/test_mpi.c tests/test_hosts.c tests/test_hf.c tests/test_report.c tests/test_readme.c
check: check-layers
	@$(MAKE) --no-print-directory cuda-emu-build
	@$(MAKE) --no-print-directory check-tests TEST_SRC="$(filter-out $(CHECK_SLOW),$(TEST_SRC))"
	@$(MAKE) --no-print-directory cuda-emu-check

# The emulated variant is built first: the README's examples use it. Packages
# are installed once, here; the rest neither installs nor fetches.
test: deps check-layers
	@$(MAKE) --no-print-directory hf-deps-fetch
	@$(MAKE) --no-print-directory s3-deps-fetch
	@$(MAKE) --no-print-directory cuda-emu-build
	@$(MAKE) --no-print-directory check-tests
	@$(MAKE) --no-print-directory cuda-emu-check

# The CUDA backend on emulated GPUs (tests/cuda_emu): every CUDA test runs.
CUDA_EMU_TESTS := tests/test_ops.c tests/test_cuda.c tests/test_cuda_train.c tests/test_cuda_costs.c tests/test_cuda_emu.c \
                  tests/test_backend.c
CUDA_EMU_VARS := CUDA=emu BUILD=build/cuda-emu BIN_DIR=build/cuda-emu/bin LIB_DIR=build/cuda-emu/lib \
                 TEST_SRC="$(CUDA_EMU_TESTS)"
cuda-emu: deps
	@$(MAKE) --no-print-directory cuda-emu-build
cuda-emu-build:
	@$(MAKE) --no-print-directory $(CUDA_EMU_VARS) all $(CUDA_EMU_TESTS:tests/%.c=build/cuda-emu/tests/%)
cuda-emu-test: deps
	@$(MAKE) --no-print-directory cuda-emu-check
cuda-emu-check:
	@$(MAKE) --no-print-directory $(CUDA_EMU_VARS) check-tests

demo: deps
	@$(MAKE) --no-print-directory all
	$(BIN) version
	$(BIN) inspect data/kjv --verify
	@bible -f gen1:1-rev22:21 > build/kjv.txt
	$(BIN) tokenizer train --in build/kjv.txt --vocab $(DEMO_VOCAB) --out build/kjv-bpe.json
	$(BIN) pack --format text --in build/kjv.txt --tokenizer build/kjv-bpe.json --seq-len 256 --val-fraction 0.1 \
	  --out build/kjv-bpe --force
	@rm -rf build/demo-ckpt
	$(BIN) train --data build/kjv-bpe --devices cpu:2 --global-batch 32 --micro-batch 8 --steps $(DEMO_STEPS) --lr 4e-3 \
	  --warmup 20 --log-every 50 --eval-every 130 --save build/demo-ckpt \
	  --metrics build/demo-metrics.jsonl --trace build/demo-trace.json --report build/demo-report.html
	$(BIN) sample --ckpt build/demo-ckpt --prompt "And God said" --tokens 80 --temperature 0.6
	@echo; echo "demo: open $(abspath build/demo-report.html) in a browser (loss, speed, time, memory, timeline)"

# The demo's tokenizer (ids: the 256 bytes, the merges, <|endoftext|>) and its steps: as long as the
# character-level run of data/kjv (450 steps) took on 2 cores (perf/demo_compare.sh measures both).
DEMO_VOCAB ?= 2048
DEMO_STEPS ?= 390

# The README's picture of a report: the demo's page through the report
# test's screenshot command (tests/test_report.c), which the test then checks.
report-screenshot: $(BUILD)/tests/test_report $(BIN)
	test -f build/demo-report.html || $(MAKE) --no-print-directory demo
	BIGBATCH_BIN=$(abspath $(BIN)) BB_REPORT_PAGE=$(abspath build/demo-report.html) $(BUILD)/tests/test_report \
	  --filter 'report/a_real_run*'
	cp build/report-screenshot.png docs/report.png

# The README's outputs, refreshed from a real run (docs/readme_output.py: the
# blocks marked `<!-- output -->`, the demo's among them), then its picture.
readme-output: all
	python3 docs/readme_output.py README.md
docs: readme-output report-screenshot

# Sanitizer builds keep their own objects and binaries under build/<name>.
asan: deps
	@$(MAKE) --no-print-directory check-tests CUDA=0 MPI=0 SAN=address,undefined BUILD=build/asan \
	  BIN_DIR=build/asan/bin LIB_DIR=build/asan/lib OPT="-O1 -g" \
	  EXTRA_CFLAGS="-fno-sanitize-recover=all"
	@$(MAKE) --no-print-directory check-tests CUDA=emu MPI=0 SAN=address,undefined BUILD=build/asan-emu \
	  BIN_DIR=build/asan-emu/bin LIB_DIR=build/asan-emu/lib OPT="-O1 -g" TEST_SRC="$(CUDA_EMU_TESTS)" \
	  EXTRA_CFLAGS="-fno-sanitize-recover=all"
# Criterion cannot start under TSan (Snaipe/Criterion#274): the threaded
# paths run from plain programs, tests/tsan_*.c, and through the CLI.
TSAN_ENV := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
tsan: deps
	@$(MAKE) --no-print-directory tsan-run CUDA=0 MPI=0 SAN=thread BUILD=build/tsan \
	  BIN_DIR=build/tsan/bin LIB_DIR=build/tsan/lib OPT="-O1 -g"
TSAN_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/tsan_*.c))
$(BUILD)/tests/tsan_%: tests/tsan_%.c tests/tsan_check.h $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $< $(LIB) $(LDLIBS) $(LDFLAGS) -o $@
tsan-run: $(TSAN_BIN) $(BIN)
	@set -e; for t in $(TSAN_BIN); do echo "== $$t"; $(TSAN_ENV) $$t; done
	@echo "== $(BIN) bench queue"; $(TSAN_ENV) $(BIN) bench queue --seconds 0.05 --runs 1 >/dev/null
	@echo "== $(BIN) bench loader"; $(TSAN_ENV) $(BIN) bench loader --data data/kjv/train --seconds 0.3 >/dev/null
	@echo "== $(BIN) bench model --threads 3 (the CPU pool: products, attention, loss)"; \
	  $(TSAN_ENV) $(BIN) bench model --layers 1 --d-model 32 --heads 2 --seq-len 130 --micro-batch 2 --threads 3 \
	    --loss-chunk 100 --steps 2 >/dev/null
	@echo "== $(BIN) train --devices cpu:3, save, resume with --zero 1, --zero 2, then --zero 3 --offload optimizer"; \
	  tmp=$$(mktemp -d); \
	  args="--data data/kjv --layers 1 --d-model 32 --heads 2 --devices cpu:3 --global-batch 24 --micro-batch 4 \
	    --steps 5 --bucket-mib 0.01 --quiet --save $$tmp/ck"; \
	  $(TSAN_ENV) $(BIN) train $$args --stop-after 2 --trace $$tmp/t.json && \
	  $(TSAN_ENV) $(BIN) train $$args --resume $$tmp/ck --zero 1 --stop-after 3 && \
	  $(TSAN_ENV) $(BIN) train $$args --resume $$tmp/ck --zero 2 --stop-after 4 && \
	  $(TSAN_ENV) $(BIN) train $$args --resume $$tmp/ck --zero 3 --offload optimizer; rc=$$?; rm -rf $$tmp; \
	  [ $$rc -eq 0 ] || { echo "FAILED: tsan train"; exit 1; }
	@echo "== $(BIN) train --devices cpu:3 --global-batch auto (replica 0 moves the batch between a step's barriers)"; \
	  $(TSAN_ENV) $(BIN) train --data data/kjv --layers 1 --d-model 32 --heads 2 --devices cpu:3 \
	    --global-batch auto:12..48 --micro-batch 4 --steps 6 --quiet
	@echo "== $(BIN) pack --threads 4"; tmp=$$(mktemp -d); \
	  head -c 3000000 /dev/urandom | base64 > $$tmp/in.txt; \
	  $(TSAN_ENV) $(BIN) pack --format text --in $$tmp/in.txt --seq-len 128 --frame-kib 8 \
	    --threads 4 --val-fraction 0.1 --out $$tmp/out >/dev/null && \
	  $(TSAN_ENV) $(BIN) inspect $$tmp/out --verify >/dev/null && \
	  echo "== $(BIN) tokenizer train --threads 3, pack --tokenizer --threads 4 (word counts, encoding on threads)" && \
	  $(TSAN_ENV) $(BIN) tokenizer train --in $$tmp/in.txt --vocab 300 --threads 3 --out $$tmp/tok.json >/dev/null && \
	  $(TSAN_ENV) $(BIN) pack --format text --in $$tmp/in.txt --tokenizer $$tmp/tok.json --seq-len 128 --threads 4 \
	    --out $$tmp/bpe >/dev/null; rc=$$?; rm -rf $$tmp; \
	  [ $$rc -eq 0 ] && echo "tsan: clean" || { echo "FAILED: tsan run"; exit 1; }

FUZZ_SECONDS ?= 60
FUZZ_BIN := build/fuzz/fuzz_shard_reader
fuzz: deps $(FUZZ_BIN)
# The shard reader and what it needs (not version.c: no build commit there).
FUZZ_SRC := $(filter-out src/core/version.c,$(wildcard src/core/*.c src/queue/*.c src/data/*.c))
$(FUZZ_BIN): tests/fuzz_shard_reader.c $(FUZZ_SRC) $(wildcard include/bigbatch/*.h src/data/*.h)
	@mkdir -p $(@D)
	clang -std=gnu11 -O1 -g -D_GNU_SOURCE -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -Iinclude $(PKG_CFLAGS) \
	  -fsanitize=fuzzer,address,undefined \
	  tests/fuzz_shard_reader.c $(FUZZ_SRC) $(PKG_LIBS) -lm -lpthread -o $@
fuzz-run: fuzz
	@mkdir -p build/fuzz/corpus
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build/fuzz/corpus tests/fuzz_seeds

# Installs what is missing, with sudo when not root. Debian/Ubuntu only.
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi
	@inc=$(CUDNN_FE_INC); dir=$$(dirname $$inc); \
	if [ ! -f $$inc/cudnn_frontend.h ]; then \
	  rm -rf $$dir.tmp && mkdir -p $$dir.tmp && \
	  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
	    -d $$dir.tmp nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) >/dev/null 2>&1 && \
	  python3 -m zipfile -e $$dir.tmp/*.whl $$dir.tmp/wheel && mkdir -p $$dir && rm -rf $$inc && \
	  mv $$dir.tmp/wheel/include $$inc && echo "deps: the cuDNN frontend $(CUDNN_FE_VERSION)'s headers in $$inc" || \
	  echo "deps: could not fetch PyPI's nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) (its headers): a CUDA build's attention runs on bigbatch's own kernels"; \
	  rm -rf $$dir.tmp; \
	fi

# The peers of the interchange tests (tests/test_tokenizer.c, tests/test_hf.c): Hugging Face's
# tokenizers and transformers, pinned, in a virtual environment over Debian's python3-torch (1.13;
# transformers 4.40 runs on it). Where PyPI is out of reach those tests say skipped, with the reason.
HF_PINS := tokenizers==0.19.1 transformers==4.40.2 safetensors==0.4.3
hf-deps: deps
	@$(MAKE) --no-print-directory hf-deps-fetch
hf-deps-fetch:
	@if ! build/hf/bin/python -c 'import tokenizers, transformers, safetensors' 2>/dev/null; then \
	  rm -rf build/hf && /usr/bin/python3 -m venv --system-site-packages build/hf && \
	  build/hf/bin/pip install -q --disable-pip-version-check $(HF_PINS) >build/hf/install.log 2>&1 && \
	  echo "hf-deps: $(HF_PINS) in build/hf" || \
	  echo "hf-deps: could not install $(HF_PINS) (build/hf/install.log): the tests that compare with them say skipped"; \
	fi

# moto's S3 server for tests/test_remote.c (SigV4 against the keys it issues):
# PyPI's moto over Debian's boto3, flask and the rest (DEB_PKGS).
MOTO_PIN := moto==4.2.14
s3-deps: deps
	@$(MAKE) --no-print-directory s3-deps-fetch
s3-deps-fetch:
	@if ! build/s3/bin/python -c 'import moto.server' 2>/dev/null; then \
	  rm -rf build/s3 && /usr/bin/python3 -m venv --system-site-packages build/s3 && \
	  build/s3/bin/pip install -q --disable-pip-version-check --no-deps $(MOTO_PIN) >build/s3/install.log 2>&1 && \
	  echo "s3-deps: $(MOTO_PIN) in build/s3" || \
	  echo "s3-deps: could not install $(MOTO_PIN) (build/s3/install.log): the S3 test says skipped"; \
	fi

# Rebuilds the embedded default dataset (see data/README.md).
data-kjv: deps all
	bible -f gen1:1-rev22:21 > build/kjv.txt
	$(BIN) pack --format text --in build/kjv.txt --seq-len 256 --val-fraction 0.1 --val-split tail --out data/kjv --force

data-fmnist: deps all
	@dpkg-query -W -f='$${Status}' dataset-fashion-mnist 2>/dev/null | grep -q "ok installed" || { \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq dataset-fashion-mnist >/dev/null; }
	$(BIN) pack --format fmnist --images /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
	  --labels /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz --out data/fmnist/train --force
	$(BIN) pack --format fmnist --images /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \
	  --labels /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz --out data/fmnist/test --force

clean:
	rm -rf build bin lib

-include $(shell find build -name '*.d' 2>/dev/null)

# perf/gpu_check.sh's fallback for a GPU machine that cannot build (no
# package registry, no -dev packages): the binary and the CUDA tests built
# here for sm_90, with the shared libraries they need that are neither the
# C library nor CUDA's. Copy build/gpu into the checkout on that machine,
# then run perf/gpu_check.sh there.
GPU_BUNDLE := build/gpu
gpu-bundle: deps
	@$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUNDLE) BIN_DIR=$(GPU_BUNDLE)/bin LIB_DIR=$(GPU_BUNDLE)/lib \
	  CUDA_GENCODE="-gencode=arch=compute_90,code=[sm_90,compute_90]" ARCH=-march=x86-64-v3 all $(GPU_BUNDLE)/tests/test_cuda
	@mkdir -p $(GPU_BUNDLE)/so && rm -f $(GPU_BUNDLE)/so/*
	@ldd $(GPU_BUNDLE)/bin/bigbatch $(GPU_BUNDLE)/tests/test_cuda | awk '/=> \// {print $$3}' | sort -u | \
	  grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda|libcublas|libnccl|libcudart' | \
	  xargs -I{} cp -L {} $(GPU_BUNDLE)/so/
	@rm -rf $(GPU_BUNDLE)/src $(GPU_BUNDLE)/kernels $(GPU_BUNDLE)/lib $(GPU_BUNDLE)/bigbatch.o $(GPU_BUNDLE)/tests/*.d
	@strip --strip-debug $(GPU_BUNDLE)/bin/bigbatch $(GPU_BUNDLE)/tests/test_cuda
	@du -sh $(GPU_BUNDLE) && ls $(GPU_BUNDLE)/so
