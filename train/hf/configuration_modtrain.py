# The configuration of a modtrain model exported for transformers (docs/hf.md): the fields of
# modtrain's ModelConfig that the forward in modeling_modtrain.py reads, with the MoD schedule
# already expanded into the routed blocks and their capacity fractions. Written by
# `modtrain export --format hf` beside modeling_modtrain.py; loaded with trust_remote_code=True.
from transformers import PretrainedConfig


class ModtrainConfig(PretrainedConfig):
    model_type = "modtrain"

    def __init__(self, vocab_size=256, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                 intermediate_size=1024, max_position_embeddings=256, mlp="gelu", norm="rms",
                 norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                 mod_routed_blocks=(), mod_capacity=(), mod_gate="identity",
                 mod_router_bias=False, mod_causal="predictor", mod_predictor_hidden=0,
                 routing="top_c", **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size                  # model.d_model
        self.num_hidden_layers = num_hidden_layers      # model.n_layers
        self.num_attention_heads = num_attention_heads  # model.n_heads
        self.intermediate_size = intermediate_size      # model.d_ff
        self.max_position_embeddings = max_position_embeddings  # model.seq_len
        self.mlp = mlp                    # "gelu" (tanh approximation) or "swiglu"
        self.norm = norm                  # "rms" or "layer"
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.mod_routed_blocks = list(mod_routed_blocks)  # 0-based, e.g. [1, 3, 5]
        self.mod_capacity = list(mod_capacity)  # each routed block's capacity fraction, (0, 1]
        self.mod_gate = mod_gate                # "identity" (x + r f) or "sigmoid" (x + sigmoid(r) f)
        self.mod_router_bias = mod_router_bias
        self.mod_causal = mod_causal            # "predictor", "aux_bce" or "none"
        self.mod_predictor_hidden = mod_predictor_hidden
        # "top_c": each routed block takes the top C of every whole sequence (as trained);
        # "causal": a token enters iff its predictor (or router) logit is > 0 (as sampled).
        # generate() always routes causally.
        self.routing = routing
        kwargs.setdefault("use_cache", False)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
