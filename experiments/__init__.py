"""The study: the paper's token-economy experiments at small scale, and their report.

Not the product: ``components/`` and ``flows/`` never import this package (an import-linter
contract in ``pyproject.toml``); it imports the product. ``python -m experiments run`` (console
script ``agent-gspo-study``; ``agent-gspo experiments ...`` forwards here) trains / evaluates each
experiment declared in ``params.yaml -> experiments.definitions`` (:mod:`.runner`) and writes one
``results/<name>.json`` each (:mod:`.results`); ``python -m experiments report`` turns that folder
into ``docs/results.md`` + PNGs (:mod:`.report`, a pure function of the folder) with a Claims
section judged by a frozen, named version of the verdict rules (:mod:`.rules`). The section's
schema is :mod:`.schema`. Import the submodules by name (this file imports nothing, so
``python -m experiments --help`` loads no model code).
"""
