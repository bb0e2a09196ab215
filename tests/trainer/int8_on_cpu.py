"""`python -m trainer`, with bitsandbytes' CPU LLM.int8() standing in for CUDA: the product
refuses an 8-bit base on the CPU (slower there than float32), tests run its code path so."""

import sys

from trainer import lora
from trainer.main import main

if __name__ == "__main__":
    lora.QUANTIZED_DEVICES = ("cuda", "cpu")
    sys.exit(main())
