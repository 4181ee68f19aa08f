# parity — set up with two commands on a fresh machine: `make run` and `make test`.
# Each target installs what it needs (idempotent: the venv is rebuilt only when
# pyproject.toml changes).

PYTHON ?= python3
VENV ?= .venv
MINDSPORE_VERSION ?= 2.8.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(MINDSPORE_VERSION)

.PHONY: install browser run test bench clean help

help:
	@echo "make run     ResNet50 parity on the embedded default (batch 2, 64x64); reports in reports/"
	@echo "make test    the test suite (installs Chromium for the browser tests when it can)"
	@echo "make bench   timing and memory benchmark"
	@echo "make install the virtualenv in $(VENV) (MINDSPORE_VERSION=$(MINDSPORE_VERSION))"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "mindspore==$(MINDSPORE_VERSION)" -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium and its driver for the HTML report's browser tests. Without root or a
# package mirror this fails, and those tests skip saying why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver >/dev/null) || \
	    echo "Chromium could not be installed: the browser tests will be skipped"; }

run: install
	$(BIN)/parity run

test: install browser
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python -m parity.bench

clean:
	rm -rf $(VENV) reports/runs reports/*.html reports/*.json reports/*.csv reports/screenshots
