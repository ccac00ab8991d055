"""``deepspeed/monitor/``: where the engine writes its scalars (monitor.py: TensorBoard, CSV,
wandb; config.py: their ds_config sections), and the wall-clock timers ``wall_clock_breakdown``
prints (timer.py, DeepSpeed's ``utils/timer.py``). Nothing is imported here: config.py is read
before any rank starts, where torch is not wanted yet."""
