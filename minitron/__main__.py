from minitron.cli import run

run()
