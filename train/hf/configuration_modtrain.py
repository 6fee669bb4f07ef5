# The configuration of a modtrain model exported for transformers (docs/hf.md): the fields of
# modtrain's ModelConfig that the forward in modeling_modtrain.py reads, with the MoD and MoE
# schedules already expanded into block lists (and MoD's capacity fractions). Written by
# `modtrain export --format hf` beside modeling_modtrain.py; loaded with trust_remote_code=True.
from transformers import PretrainedConfig


class ModtrainConfig(PretrainedConfig):
    model_type = "modtrain"

    def __init__(self, vocab_size=256, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                 intermediate_size=1024, max_position_embeddings=256, mlp="gelu", norm="rms",
                 norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                 mod_routed_blocks=(), mod_capacity=(), mod_gate="identity",
                 mod_router_bias=False, mod_causal="predictor", mod_predictor_hidden=0,
                 moe_blocks=(), moe_n_experts=4, moe_d_expert=0, moe_routing="expert_choice",
                 moe_capacity_factor=1.0, moe_top_k=1, moe_noop_expert=False,
                 moe_noop_capacity=0.5, moe_router_bias=False, routing="top_c", **kwargs):
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
        self.moe_blocks = list(moe_blocks)      # 0-based blocks whose MLP is an MoE, e.g. [0, 1]
        self.moe_n_experts = moe_n_experts      # real experts E
        self.moe_d_expert = moe_d_expert        # expert hidden width; 0: intermediate_size
        self.moe_routing = moe_routing          # "expert_choice" or "token_choice"
        self.moe_capacity_factor = moe_capacity_factor
        self.moe_top_k = moe_top_k              # token choice: experts per token, 1 or 2
        self.moe_noop_expert = moe_noop_expert  # integrated MoDE: the router's last column
        self.moe_noop_capacity = moe_noop_capacity  # the no-op expert's share of each sequence
        self.moe_router_bias = moe_router_bias
        # "top_c": training's routing over every whole sequence (each routed block's top C, each
        # MoE's expert or token choice); "causal": a token enters a routed block iff its
        # predictor (or router) logit is > 0, and picks its own experts (as sampled).
        # generate() always routes causally.
        self.routing = routing
        kwargs.setdefault("use_cache", False)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
