"""Training: losses (nn.Modules) and models trained in this project.

Done: the Sub-Sentence Encoder baseline (``subencoder``) and its supervised contrastive
loss. Pending (issue 4): teachers CE / CE', the multi-granular KL loss and its trainer.
"""
