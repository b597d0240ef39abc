# pipelines/lib/recipe.mk — the body shared by the task recipes
# (pipelines/gsm8k, pipelines/countdown): each sets OUT, MAX_TOKENS and TASK
# with ?= and includes this file.  The targets:
#
#   make MODEL=DIR DATA=train.jsonl    train (resumes)
#   make eval MODEL=DIR TEST=test.jsonl   greedy accuracy of the newest checkpoint
#   make status                        step reached, last metrics line
#   make clean                         remove $(OUT)
#
# Safe from cron: one run at a time per OUT (a lock), a finished run does
# nothing, a killed run goes on where it stopped.

TOP   := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
BUILD ?= $(TOP)/$(or $(RL_BUILD),build)
export PATH := $(BUILD)/bin:$(PATH)

MODEL      ?=
DATA       ?= data/train.jsonl
TEST       ?= data/test.jsonl
DEVICE     ?= cuda
STEPS      ?= 200
BATCH      ?= 32
SAMPLES    ?= 8
LR         ?= 1e-6
TEMP       ?= 1
STALENESS  ?= 1
SAVE_EVERY ?=
SAVE_MINUTES ?=
CHAT       ?= 1
ALGO       ?= grpo
REWARD     ?=
EXTRA_TRAIN ?=
# rl-reward's scoring options, quotes and all (REWARD="--exec 'python3 r.py'"):
# through the environment, so that no quoting here breaks them
export REWARD

.PHONY: all train eval status clean
all: train

train:
	@MODEL='$(MODEL)' PROMPTS='$(DATA)' OUT='$(OUT)' TASK='$(TASK)' STEPS='$(STEPS)' \
	 BATCH='$(BATCH)' SAMPLES='$(SAMPLES)' LR='$(LR)' TEMP='$(TEMP)' MAX_TOKENS='$(MAX_TOKENS)' \
	 DEVICE='$(DEVICE)' STALENESS='$(STALENESS)' SAVE_EVERY='$(SAVE_EVERY)' SAVE_MINUTES='$(SAVE_MINUTES)' CHAT='$(CHAT)' \
	 ALGO='$(ALGO)' EXTRA_TRAIN='$(EXTRA_TRAIN)' \
	 sh $(TOP)/pipelines/lib/grpo-queue.sh

eval:
	@OUT='$(OUT)' MODEL='$(MODEL)' TEST='$(TEST)' TASK='$(TASK)' DEVICE='$(DEVICE)' \
	 MAX_TOKENS='$(MAX_TOKENS)' CHAT='$(CHAT)' sh $(TOP)/pipelines/lib/eval.sh

status:
	@[ -L '$(OUT)/ckpt/latest' ] && echo "step: $$(readlink '$(OUT)/ckpt/latest')" || echo "no checkpoint yet"
	@[ -s '$(OUT)/metrics.jsonl' ] && tail -n 1 '$(OUT)/metrics.jsonl' || true

clean:
	rm -rf '$(OUT)'
