import asyncio
import threading

from api.broker import Broker


def test_fan_out_and_lagging_client() -> None:
    async def scenario() -> None:
        broker = Broker(queue_size=1000)
        broker.bind(asyncio.get_running_loop())
        fast, slow, other = broker.subscribe("j"), broker.subscribe("j"), broker.subscribe("k")
        assert broker.clients == 3
        for start in range(0, 1500, 100):
            broker.publish("j", [{"id": i} for i in range(start, start + 100)])
            while not fast.queue.empty():  # a reader keeps up
                fast.queue.get_nowait()
        assert slow.lagged and slow.queue.qsize() == 1
        assert await slow.queue.get() == {"lagged": True}  # told to re-read from the database
        assert other.queue.empty()
        broker.unsubscribe(fast)
        assert broker.clients == 2
        broker.close()
        assert await other.queue.get() is None

    asyncio.run(scenario())


def test_publish_from_another_thread() -> None:
    async def scenario() -> None:
        broker = Broker(queue_size=10)
        broker.bind(asyncio.get_running_loop())
        subscription = broker.subscribe("j")
        thread = threading.Thread(target=broker.publish, args=("j", [{"id": 1}]))
        thread.start()
        thread.join()
        assert await asyncio.wait_for(subscription.queue.get(), 5) == {"id": 1}

    asyncio.run(scenario())
