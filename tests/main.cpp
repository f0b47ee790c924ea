// Test entry point: installs the counting allocator before any tensor exists.
#include <gtest/gtest.h>

#include "ration/base/allocator.h"

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
