"""The experiment configs (`--config=experiments/NAME.py[:VARIANT]`), a
package so that an installed lm_zoo carries them: a command line naming
experiments/NAME.py where no such file is finds the installed one
(lm_zoo/programs.py). They are read by path, as ml_collections config files,
not imported as modules."""
