// Shared CPU-test assertion: a call must throw taxfree::Error with the given status and a message
// naming `needle`.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "taxfree/runtime/error.h"

namespace taxfree::test {

inline void expect_error(const std::function<void()>& fn, Status status, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not name '" << needle << "'";
  }
}

inline void expect_invalid(const std::function<void()>& fn, const std::string& needle) {
  expect_error(fn, Status::InvalidArgument, needle);
}

}  // namespace taxfree::test
