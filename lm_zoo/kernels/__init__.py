"""Pallas kernels of one recurrent time step, forward and backward: the LSTM
step (`lstm_step`), every Mogrifier round of a step (`mogrifier_rounds`) and
the aLSTM step, its adaptation model and policy included (`alstm_step`);
what they share is in `common`. The windows that run them and their
hand-written backward passes are in `lm_zoo.cells` (`pallas_lstm`,
`pallas_mogrifier`, `pallas_alstm`), chosen by `scan='pallas'`.
`persistent_lstm` runs the LSTM's forward pass over a whole window as one
persistent Mosaic GPU kernel (Hopper), `persistent_lstm_backward` its
backward chain as another, their blocks kept in step by `grid_barrier`;
`lm_zoo.cells.persistent_lstm` differentiates
the window with both. `persistent_mogrifier` runs a Mogrifier LSTM layer's
forward pass (its low-rank rounds and the LSTM) over a window as another,
`persistent_mogrifier_backward` its backward chain. `scan='persistent'`
runs them (benchmarks/persistent_probe.py and persistent_mogrifier_probe.py
check and time them on a GPU)."""
