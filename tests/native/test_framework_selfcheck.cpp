// Checks of the test framework itself (native_test.h).
#include "native_test.h"

TEST(framework_same_bits) {
  CHECK(lever_test::same_bits(1.0f, 1.0f));
  CHECK(!lever_test::same_bits(0.0f, -0.0f));
  float a[3] = {1, 2, 3}, b[3] = {1, 2, 4};
  CHECK_EQ(lever_test::first_bit_difference(a, b, 3), 2);
  CHECK_EQ(lever_test::first_bit_difference(a, a, 3), -1);
}

TEST(framework_rng_is_reproducible) {
  lever_test::Rng a(7), b(7);
  for (int i = 0; i < 10; ++i) CHECK_EQ(a.next_u64(), b.next_u64());
  lever_test::Rng c(1);
  for (int i = 0; i < 1000; ++i) {
    float u = c.uniform(-2.0f, 3.0f);
    CHECK(u >= -2.0f && u < 3.0f);
  }
}
