"""Model code: the MiniCPM-V 4.6 processor, vision tower, GDN layers and M-RoPE on each vLLM."""
