"""place_order.py: write an order and enqueue its confirmation in one transaction."""

from shop import engine, metadata, orders, send_confirmation
from sqlalchemy import insert


def place_order(email: str, total_cents: int) -> int:
    with engine.begin() as conn:
        result = conn.execute(insert(orders).values(email=email, total_cents=total_cents))
        order_id = result.inserted_primary_key[0]
        send_confirmation.enqueue_tx(conn, {"order_id": order_id, "email": email})
    # Committed: the order exists and its confirmation will be sent.
    # Had the block raised, neither the order nor the task would exist.
    return order_id


if __name__ == "__main__":
    metadata.create_all(engine)  # the shop's own tables (your migrations would do this)
    print("placed order", place_order("ada@example.com", 4200))
