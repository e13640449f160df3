# The two set-up commands of the README: `make demo` and `make test`.
VENV ?= .venv
STAMP := $(VENV)/.medray-installed
DEMO_DIR ?= runs/demo

.PHONY: install demo test lint bench docs

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/medray demo --output $(DEMO_DIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check medray tests jobs tune bench serve

# The manual (docs/, mkdocs.yml) as a static site in site/ (git-ignored).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site
