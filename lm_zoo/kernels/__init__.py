"""Pallas kernels of one recurrent time step, forward and backward: the LSTM
step (`lstm_step`) and every Mogrifier round of a step (`mogrifier_rounds`).
The windows that run them and their hand-written backward passes are in
`lm_zoo.cells` (`pallas_lstm`, `pallas_mogrifier`), chosen by `scan='pallas'`."""
