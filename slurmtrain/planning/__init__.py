"""Pure arithmetic before anything runs: memory per ZeRO stage, FLOPs and MFU, ETA, checkpoint interval."""
