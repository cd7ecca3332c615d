"""Our MoE layer beside the peers' in the same processes: torchtitan's (peers_titan) and Megatron-Core's
(peers_megatron), same weights, inputs and routing; peers_body is what each rank runs."""
