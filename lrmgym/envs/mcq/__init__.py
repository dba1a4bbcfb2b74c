"""``lrmgym/MultipleChoice-v0``: multiple-choice questions (GPQA-style) with seeded option order and a strict letter."""
