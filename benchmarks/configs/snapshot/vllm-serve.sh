# start the server (benchmarks/behaviour_snapshot.py: `memfit check` hands a vllm serve
# command line to the vLLM start-up model)
vllm serve meta-llama/Llama-3.1-8B \
  --max-model-len 16384 --gpu-memory-utilization 0.85 --port 8000
