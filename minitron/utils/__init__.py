"""minitron.utils: DeepSpeed's ``deepspeed/utils`` pieces that the comm layer needs (the comms
logger), kept where DeepSpeed keeps them."""
