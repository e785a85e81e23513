"""The Python contender of benches/llm.rs: the same chat requests batchinfer's generate sends,
from an asyncio client (httpx) at the same concurrency, one request per prompt, the replies'
texts collected in order.

  python python_llm.py URL N CONCURRENCY MAX_TOKENS
"""

import asyncio
import sys

import httpx


async def main(url, n, concurrency, max_tokens):
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def ask(i):
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": f"Say a word about the number {i}"}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "seed": 7,
            }
            async with limit:
                r = await client.post(f"{url}/chat/completions", json=body)
                r.raise_for_status()
                return r.json()["choices"][0]["message"]["content"]

        texts = await asyncio.gather(*(ask(i) for i in range(n)))
    assert len(texts) == n and all(t is not None for t in texts)


if __name__ == "__main__":
    url, n, concurrency, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    asyncio.run(main(url, n, concurrency, max_tokens))
