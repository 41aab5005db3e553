"""The Mogrifier paper's tuned models (Melis et al. 2020) as lamb trained them,
for accelerator hosts.

Each variant is one of the config files lamb published for the paper, in
deepmind/lamb's lamb/experiment/mogrifier/config/ (named beside it below);
the values are copied from the file under lamb's own names, and
`lm_zoo.experiments.recipes.lamb_config` sets what all of them share (the capped input
gate, skip connections, state dropping, per-step dropout masks, lamb's
initialisation, Adam with beta1 = 0, the loss summed over the window with
its L2 term clipped at norm 10, turns and the averaging trigger).
docs/differences.md lists what still differs from lamb's code. Paper
(Tables 1 and 2, no dynamic evaluation, valid / test):

  ptb_lstm, ptb_mogrifier                  PTB, 24M     55.8 / 54.6, 52.1 / 51.0
  wikitext2_lstm, wikitext2_mogrifier      WT2 MoS2, 35M  62.6 / 60.1, 58.7 / 56.6
  ptb_char_mogrifier                       PTB-char, 24M  1.149 / 1.131 bpc
  enwik8_48m_lstm, enwik8_48m_mogrifier    enwik8, 48M  1.182 / 1.195, 1.135 / 1.146 bpc
  enwik8_96m_lstm, enwik8_96m_mogrifier    enwik8, 96M  1.145 / 1.155, 1.110 / 1.122 bpc

lamb scores at a softmax temperature tuned on validation
(`eval_softmax_temperature=-0.8`: 1.06 down to 0.8); score a trained run that
way with `lm-zoo-eval --workdir=... --temperature=tune`.

  lm-zoo-train --config=experiments/mogrifier_paper.py:ptb_mogrifier --workdir=runs/mog
"""

from lm_zoo.experiments.recipes import lamb_config

_PTB = dict(
  data='ptb',
  num_params=24_000_000,
  num_layers=2,
  batch_size=64,
  max_time_steps=70,
  share_input_and_output_embeddings=True,
  input_embedding_ratio=1.0,
  mos_num_components=0,
  steps_per_turn=200,
  turns=1000,
  trigger_averaging_turns=50,
  trigger_averaging_at_the_latest=800,
)
_WT2 = dict(
  data='wikitext2',
  num_params=35_000_000,
  num_layers=2,
  batch_size=64,
  max_time_steps=70,
  share_input_and_output_embeddings=True,
  mos_num_components=2,
  steps_per_turn=200,
  turns=1000,
  trigger_averaging_turns=50,
  trigger_averaging_at_the_latest=800,
)
_ENWIK8 = dict(
  data='enwik8',
  num_layers=4,
  batch_size=128,
  max_time_steps=500,
  share_input_and_output_embeddings=False,
  input_embedding_ratio=1.0,
  mos_num_components=0,
  steps_per_turn=400,
  turns=100,
  trigger_averaging_turns=10,
  trigger_averaging_at_the_latest=80,
)

# variant -> lamb's fields; the comment names the config file they are copied from.
VARIANTS = {
  # 786252db3825+_tune_ptb_24m_lstm_d2_arms/trial_833/config
  'ptb_lstm': dict(
    _PTB,
    feature_mask_rounds=0,
    feature_mask_rank=0,
    input_dropout=0.6275626425150355,
    inter_layer_dropout=0.3069926535017156,
    state_dropout=0.3692225400980858,
    output_dropout=0.6901712653612706,
    l2_penalty=0.00024908138497223704,
    learning_rate=0.0030369099569192135,
  ),
  # 786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483/config
  'ptb_mogrifier': dict(
    _PTB,
    feature_mask_rounds=5,
    feature_mask_rank=84,
    input_dropout=0.7290787773167251,
    inter_layer_dropout=0.2909822365241189,
    state_dropout=0.38729439899832296,
    output_dropout=0.7156690388448465,
    l2_penalty=0.00025235335778471014,
    learning_rate=0.002299987130225388,
  ),
  # c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_d2_arms/trial_763/config
  'wikitext2_lstm': dict(
    _WT2,
    feature_mask_rounds=0,
    feature_mask_rank=0,
    input_embedding_ratio=0.3530770457779424,
    input_dropout=0.6090979517941943,
    inter_layer_dropout=0.09075401405970591,
    state_dropout=0.2714030562283111,
    output_dropout=0.34845530389157287,
    l2_penalty=0.00023063627783021125,
    learning_rate=0.003183909546336849,
  ),
  # c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747/config
  'wikitext2_mogrifier': dict(
    _WT2,
    feature_mask_rounds=6,
    feature_mask_rank=48,
    input_embedding_ratio=0.1993194960596213,
    input_dropout=0.5469087645499495,
    inter_layer_dropout=0.1988228263748591,
    state_dropout=0.22137985867236876,
    output_dropout=0.34766651193735193,
    l2_penalty=0.00018994987193751323,
    learning_rate=0.003287792100749033,
  ),
  # 0393c7dc3532+_tune_ptb_char_24m_lstm_fm_d2_asgd_ts150/trial_596/config (batch 64,
  # where the paper says 128 for character-level tasks)
  'ptb_char_mogrifier': dict(
    data='ptb_char',
    num_params=24_000_000,
    num_layers=2,
    batch_size=64,
    max_time_steps=150,
    share_input_and_output_embeddings=False,
    input_embedding_ratio=1.0,
    mos_num_components=0,
    steps_per_turn=200,
    turns=500,
    trigger_averaging_turns=25,
    trigger_averaging_at_the_latest=400,
    feature_mask_rounds=4,
    feature_mask_rank=24,
    input_dropout=0.27860252841733274,
    inter_layer_dropout=0.0737609984911853,
    state_dropout=0.17118611234551975,
    output_dropout=0.2347428361918374,
    l2_penalty=0.00025558089199237096,
    learning_rate=0.003739598828019367,
  ),
  # 4d0a9a5bdb04+_tune_enwik8_48m_lstm_d4_arms/trial_400/config
  'enwik8_48m_lstm': dict(
    _ENWIK8,
    num_params=48_000_000,
    feature_mask_rounds=0,
    feature_mask_rank=0,
    input_dropout=0.16279440026790548,
    inter_layer_dropout=0.11949666753873665,
    state_dropout=0.1036809388104279,
    output_dropout=0.13860156332143037,
    l2_penalty=2.5181258956042348e-05,
    learning_rate=0.002516709293528533,
  ),
  # 4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234/config
  'enwik8_48m_mogrifier': dict(
    _ENWIK8,
    num_params=48_000_000,
    feature_mask_rounds=6,
    feature_mask_rank=79,
    input_dropout=0.015496029112930465,
    inter_layer_dropout=0.008633961431527571,
    state_dropout=0.0437288219541186,
    output_dropout=0.138307173174503,
    l2_penalty=0.000993383826740019,
    learning_rate=0.001021423409385794,
  ),
  # e81db31261c0+_tune_enwik8_96m_lstm_d4_arms/trial_295/config (lamb accumulates
  # the 128 rows' gradient in two halves, accum_batch_size=64: the same gradient)
  'enwik8_96m_lstm': dict(
    _ENWIK8,
    num_params=96_000_000,
    feature_mask_rounds=0,
    feature_mask_rank=0,
    input_dropout=0.1233672355450206,
    inter_layer_dropout=0.12636500626697247,
    state_dropout=0.13063181510547955,
    output_dropout=0.24846692818769148,
    l2_penalty=5.853555404849184e-05,
    learning_rate=0.001975213597736287,
  ),
  # e81db31261c0+_tune_enwik8_96m_lstm_fm_d4_arms_MtngW/trial_216/config (as above)
  'enwik8_96m_mogrifier': dict(
    _ENWIK8,
    num_params=96_000_000,
    feature_mask_rounds=5,
    feature_mask_rank=61,
    input_dropout=0.015908852824256536,
    inter_layer_dropout=0.13785990907975867,
    state_dropout=0.1648727901535727,
    output_dropout=0.2878539844807166,
    l2_penalty=4.409390792135428e-05,
    learning_rate=0.0022480107672343715,
  ),
}


def get_config(variant: str = 'ptb_mogrifier'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  return lamb_config(**VARIANTS[variant])
