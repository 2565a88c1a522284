// The test programs' main: doctest's, plus one rule. ctest runs each case by name
// (--test-case=NAME, commas escaped by doctest_discover_tests); a filter that matches no case
// (a renamed test, a name the escaping misses) would run nothing and pass. So it fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

int cases_started = 0;

struct case_counter : doctest::IReporter {
  explicit case_counter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++cases_started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("case_counter", 1, case_counter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases, ...
  if (rc == 0 && cases_started == 0) {
    std::fprintf(stderr, "no test case matched the filter\n");
    return 1;
  }
  return rc;
}
