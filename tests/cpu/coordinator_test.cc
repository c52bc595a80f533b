// The coordinator in one process: clients on threads, as ranks would use it.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <thread>

#include "expect_error.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

struct Job {
  CoordinatorServer server;
  std::vector<std::unique_ptr<CoordinatorClient>> ranks;
  explicit Job(int world = 3) : server("127.0.0.1", 0, world) {
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<CoordinatorClient>("127.0.0.1", server.port(), r, world, 10));
      ranks.back()->set_exit_grace(0);  // tests must not be ended by the watchdog
    }
  }
  void finish() {
    for (auto& c : ranks) c->finish();
  }
};

template <class F>
void on_all(Job& job, F f) {
  std::vector<std::thread> ts;
  for (int r = 0; r < int(job.ranks.size()); ++r) ts.emplace_back([&, r] { f(r, *job.ranks[size_t(r)]); });
  for (auto& t : ts) t.join();
}

TEST(Coordinator, SetGetAllGatherAndBarrier) {
  Job job;
  std::string binary("\x00\x01\xff\n id", 7);
  job.ranks[0]->set("id", binary);
  EXPECT_EQ(job.ranks[2]->get("id", 5), binary);
  std::vector<std::vector<std::string>> got(3);
  on_all(job, [&](int r, CoordinatorClient& c) {
    got[size_t(r)] = c.all_gather("g", "value-" + std::to_string(r), 5);
    c.barrier("b", 5);
    c.barrier("b", 5);  // the same name twice in a row
  });
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<std::string>{"value-0", "value-1", "value-2"}));
  job.finish();
}

// A call that returns before its deadline disarms it at once: nothing is reported and the process
// lives on past the limit (an armed one would end this test process). Calls from several threads
// at once, as an op's NCCL calls arm one each. The stalled call's side is
// Launcher.StalledCallEndsItsRankAtTheCallDeadlineAndTheJobNamesIt.
TEST(CallDeadline, CallsThatReturnDisarmTheirs) {
  // 1 s limits, each call ~2 ms: a sanitized or loaded machine stays far inside them (a 0.3 s limit
  // over the whole loop could fire legitimately there), and the wait below outlasts every one.
  constexpr double kLimit = 1.0;
  Job job(1);
  std::vector<std::thread> threads;
  std::vector<double> longest(4, 0.0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        {
          const CallDeadline deadline(*job.ranks[0], "a quick call", kLimit);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        longest[size_t(t)] = std::max(longest[size_t(t)], took);
      }
    });
  for (auto& t : threads) t.join();
  // Every call returned inside its limit, so none of the deadlines may fire.
  for (const double s : longest) EXPECT_LT(s, kLimit);
  std::this_thread::sleep_for(std::chrono::duration<double>(kLimit + 0.3));
  EXPECT_EQ(job.server.first_failure(), "");
  EXPECT_FALSE(job.ranks[0]->aborted());
  job.finish();
}

// Without a coordinator (ranks simulated in one process, no NCCL) it does nothing; a limit that is
// not a positive finite time is refused before anything is armed.
TEST(CallDeadline, NoCoordinatorDisarmsItAndABadLimitIsRefused) {
  {
    const CallDeadline deadline(nullptr, "a call without a coordinator", 0.01);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // armed, this would end the process
  }
  Job job(1);
  for (const double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    try {
      const CallDeadline deadline(*job.ranks[0], "a call", bad);
      ADD_FAILURE() << "limit " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("CallDeadline for a call: limit"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(job.server.first_failure(), "");
  job.finish();
}

// Every world the ops run at, 1 to 8: the all-gather in rank order on every rank, barriers reused.
TEST(Coordinator, AllGatherAndBarrierAtEveryWorld) {
  for (int w = 1; w <= 8; ++w) {
    Job job(w);
    std::vector<std::vector<std::string>> got(static_cast<size_t>(w));
    on_all(job, [&](int r, CoordinatorClient& c) {
      c.barrier("b", 5);
      got[size_t(r)] = c.all_gather("g", "v" + std::to_string(r * r), 5);
      c.barrier("b", 5);
    });
    std::vector<std::string> want;
    for (int r = 0; r < w; ++r) want.push_back("v" + std::to_string(r * r));
    for (int r = 0; r < w; ++r) EXPECT_EQ(got[size_t(r)], want) << "world " << w << " rank " << r;
    job.finish();
  }
}

// The check modes' comparison: the same call passes; a rank whose call differs is named with both
// calls, on every rank; a rank that makes no call is named in the Timeout of the ranks that did.
TEST(Coordinator, RequireSameCallNamesTheRankThatDiffers) {
  Job job(4);
  on_all(job, [&](int, CoordinatorClient& c) { require_same_call(c, "op", "op launch", 0, "ag M=8", 5); });
  std::vector<std::string> errors(4);
  on_all(job, [&](int r, CoordinatorClient& c) {
    try {
      require_same_call(c, "op", "op launch", 1, r == 2 ? "ag M=16" : "ag M=8", 5);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidUsage);
      errors[size_t(r)] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("op launch #1 differs across ranks: rank 0 did ag M=8, rank 2 did ag M=16"), std::string::npos)
        << e;
  std::vector<std::thread> ts;
  for (int r : {0, 1, 3})
    ts.emplace_back([&, r] {
      try {
        require_same_call(*job.ranks[size_t(r)], "op", "op launch", 2, "ag M=8", 0.3);
        ADD_FAILURE() << "rank " << r << ": no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::Timeout);
        EXPECT_NE(std::string(e.what()).find("op launch #2: rank 2 made none within"), std::string::npos) << e.what();
      }
    });
  for (auto& t : ts) t.join();
  job.finish();
}

TEST(Coordinator, GetTimesOutNamingTheKey) {
  Job job;
  try {
    job.ranks[1]->get("never-set", 0.2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Timeout);
    EXPECT_NE(std::string(e.what()).find("'never-set'"), std::string::npos) << e.what();
  }
  job.finish();
}

bool aborts_within(const CoordinatorClient& c, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!c.aborted() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return c.aborted();
}

// Rank 0 times out (Timeout); the waiting rank 2 and the missing rank 1 are both told who never
// arrived.
TEST(Coordinator, BarrierTimeoutNamesMissingRanksToEveryone) {
  Job job;
  std::thread t0([&] {
    try {
      job.ranks[0]->barrier("x", 0.3);
      ADD_FAILURE() << "the barrier passed without rank 1";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::Timeout) << e.what();
    }
  });
  std::thread t2([&] { EXPECT_THROW(job.ranks[2]->barrier("x", 5), Error); });
  t0.join();
  t2.join();
  for (int r : {1, 2}) {
    EXPECT_TRUE(aborts_within(*job.ranks[r], 2)) << "rank " << r;
    EXPECT_NE(job.ranks[r]->abort_message().find("rank(s) 1 never arrived"), std::string::npos)
        << "rank " << r << ": " << job.ranks[r]->abort_message();
  }
  EXPECT_NE(job.server.first_failure().find("host barrier 'x' timed out"), std::string::npos);
}

TEST(Coordinator, FailureIsBroadcastAndWakesWaiters) {
  Job job;
  bool called = false;
  job.ranks[2]->on_abort([&] { called = true; });
  std::thread waiter([&] {
    try {
      job.ranks[2]->get("never", 30);
      ADD_FAILURE() << "get returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::RemoteError);
      EXPECT_NE(std::string(e.what()).find("rank 1 failed: out of cheese"), std::string::npos) << e.what();
    }
  });
  job.ranks[1]->fail("out of cheese");
  waiter.join();
  EXPECT_TRUE(called);
  EXPECT_TRUE(job.ranks[0]->aborted() || [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return job.ranks[0]->aborted();
  }());
  EXPECT_FALSE(job.ranks[1]->aborted()) << "the failing rank is not told about itself";
  EXPECT_THROW(job.ranks[0]->throw_if_aborted(), Error);
}

// The launcher reports a rank that exited non-zero right after its BYE (a benchmark's "wrong
// elements"): the job's first failure, told to nobody (the BYE is read first, even when the
// report comes before the server thread got to it); a later failure is still told to everyone.
TEST(Coordinator, ExitAfterFinishingIsRecordedNotBroadcastAndALaterFailureIs) {
  Job job;
  on_all(job, [](int, CoordinatorClient& c) { c.barrier("start", 5); });  // every HELLO read
  job.ranks[0]->finish();
  job.server.rank_ended_abnormally(0, "rank 0 (pid 1) exited with code 5", true);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(job.ranks[1]->aborted()) << job.ranks[1]->abort_message();
  EXPECT_FALSE(job.ranks[2]->aborted()) << job.ranks[2]->abort_message();
  EXPECT_EQ(job.server.first_failure(), "rank 0: rank 0 (pid 1) exited with code 5");
  job.ranks[1]->fail("out of cheese");
  for (int i = 0; i < 100 && !job.ranks[2]->aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(job.ranks[2]->aborted());
  EXPECT_NE(job.ranks[2]->abort_message().find("out of cheese"), std::string::npos) << job.ranks[2]->abort_message();
  EXPECT_EQ(job.server.first_failure(), "rank 0: rank 0 (pid 1) exited with code 5");
}

// The launcher's thread reads a reaped rank's last lines (rank_ended_abnormally) while the
// coordinator's thread may be between its poll() and its read of the same socket: that read must
// not block holding the coordinator's lock (it did: every later call then waited until the rank
// wrote again). Many short jobs, to meet the window; a blocked coordinator is unblocked by a write.
TEST(Coordinator, ReadingAReapedRanksLastLinesNeverBlocksTheCoordinator) {
  for (int i = 0; i < 2000; ++i) {
    Job job(2);
    on_all(job, [](int, CoordinatorClient& c) { c.barrier("start", 5); });
    job.ranks[0]->finish();
    // 0-49 us after the BYE is sent: sweeps the moment the coordinator's poll() wakes up for it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 50);
    while (std::chrono::steady_clock::now() < until) {
    }
    job.server.rank_ended_abnormally(0, "rank 0 (pid 1) exited with code 5", true);
    auto failure = std::async(std::launch::async, [&] { return job.server.first_failure(); });
    if (failure.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      ADD_FAILURE() << "job " << i << ": the coordinator was blocked for 2 s after reading rank 0's last lines";
      job.ranks[0]->fail("unblock the coordinator's read");
      failure.get();
      return;
    }
    EXPECT_EQ(failure.get(), "rank 0: rank 0 (pid 1) exited with code 5") << "job " << i;
  }
}

// A rank that ended by a signal, or that never said it finished, is told to every rank.
TEST(Coordinator, SignalledOrUnfinishedRankIsBroadcast) {
  for (const bool finished : {true, false}) {
    Job job;
    on_all(job, [](int, CoordinatorClient& c) { c.barrier("start", 5); });
    if (finished) job.ranks[0]->finish();
    job.server.rank_ended_abnormally(0, "rank 0 (pid 1) ended", !finished);  // signalled, or exited unfinished
    for (int i = 0; i < 100 && !job.ranks[1]->aborted(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(job.ranks[1]->aborted()) << "finished " << finished;
  }
}

TEST(Coordinator, DisconnectWithoutFinishingIsAFailure) {
  Job job;
  job.ranks[0]->finish();
  job.ranks[0].reset();  // a clean exit: not a failure
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(job.ranks[1]->aborted());
  job.ranks[2].reset();  // vanished without finish(): like a killed process
  for (int i = 0; i < 100 && !job.ranks[1]->aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(job.ranks[1]->aborted());
  EXPECT_NE(job.ranks[1]->abort_message().find("rank 2 failed"), std::string::npos) << job.ranks[1]->abort_message();
}

TEST(Coordinator, KeysAndNamesWithSpacesOrLineBreaksAreRefused) {
  Job job(1);
  for (const std::string bad : {"my key", "two\nlines", "", "tab\there"}) {
    EXPECT_THROW(job.ranks[0]->set(bad, "v"), Error) << bad;
    EXPECT_THROW(job.ranks[0]->get(bad, 0.1), Error) << bad;
    EXPECT_THROW(job.ranks[0]->barrier(bad, 0.1), Error) << bad;
  }
  try {
    job.ranks[0]->barrier("my barrier", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("barrier name 'my barrier' must be non-empty and without spaces"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(job.ranks[0]->aborted());  // refused before anything was sent
  job.finish();
}

// A connection speaking the protocol by hand, for orders of messages a client cannot be timed into.
struct RawRank {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  explicit RawRank(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~RawRank() { ::close(fd); }
  void send(const std::string& lines) { EXPECT_EQ(::send(fd, lines.data(), lines.size(), 0), ssize_t(lines.size())); }
  // What the server sent within `seconds` (until it sends nothing more for that long).
  std::string received(double seconds) {
    std::string got;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, int(seconds * 1000)) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, size_t(n));
    }
    return got;
  }
};

TEST(Coordinator, BothClaimantsOfARankAreTold) {
  Job job(2);
  RawRank other(job.server.port());  // another process claiming live rank 0
  other.send("HELLO 0 " + std::to_string(long(::getpid()) + 1) + "\n");
  for (const auto& c : job.ranks) {
    EXPECT_TRUE(aborts_within(*c, 5)) << "rank " << c->rank();
    EXPECT_NE(c->abort_message().find("two processes claim rank 0"), std::string::npos) << c->abort_message();
  }
  EXPECT_NE(other.received(0.5).find("two processes claim rank 0"), std::string::npos);
}

// A process joining again (a new Team) before the server has read its old connection's BYE, or
// with that connection unfinished: its own new generation, not a second claimant.
TEST(Coordinator, TheSameProcessRejoiningIsANewGenerationWhateverItsOldConnection) {
  Job job(2);
  CoordinatorClient again0("127.0.0.1", job.server.port(), 0, 2, 10);  // rank 0's old client never finished
  again0.set_exit_grace(0);
  job.ranks[1]->finish();
  CoordinatorClient again1("127.0.0.1", job.server.port(), 1, 2, 10);
  again1.set_exit_grace(0);
  std::vector<std::string> got0;
  std::thread t([&] { got0 = again0.all_gather("id", "a", 5); });
  EXPECT_EQ(again1.all_gather("id", "b", 5), (std::vector<std::string>{"a", "b"}));
  t.join();
  EXPECT_EQ(got0, (std::vector<std::string>{"a", "b"}));
  for (const CoordinatorClient* c : {job.ranks[0].get(), job.ranks[1].get(), &again0, &again1})
    EXPECT_FALSE(aborts_within(*c, 0.2)) << c->abort_message();
  job.ranks[0]->finish(), again0.finish(), again1.finish();
}

TEST(Coordinator, BarrierTimeoutAsTheBarrierPassesBlamesNobody) {
  // Rank 1 waits at the barrier; rank 0's arrival completes it, and its timeout, sent right after
  // on the same connection, finds it passed: nobody is missing.
  CoordinatorServer server("127.0.0.1", 0, 2);
  RawRank rank0(server.port());  // rank 0 is a hand-driven connection
  CoordinatorClient rank1("127.0.0.1", server.port(), 1, 2, 10);
  rank1.set_exit_grace(0);
  std::thread t1([&] {  // it passes, or sees the abort first: either way it does not wait out its 10 s
    try {
      rank1.barrier("late", 10);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::RemoteError) << e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  rank0.send("HELLO 0 1\nBAR late\nBARTIMEOUT late 0\n");
  t1.join();
  ASSERT_TRUE(aborts_within(rank1, 5));
  EXPECT_NE(rank1.abort_message().find("just as the last rank arrived"), std::string::npos) << rank1.abort_message();
  EXPECT_EQ(rank1.abort_message().find("never arrived"), std::string::npos) << rank1.abort_message();
}

TEST(Coordinator, SettingAKeyAgainWithAnotherValueFailsTheJobNamingTheKey) {
  Job job(2);
  job.ranks[0]->set("id", "first");
  EXPECT_EQ(job.ranks[1]->get("id", 5), "first");
  job.ranks[1]->set("id", "first");  // the same value again: nothing to split
  EXPECT_EQ(job.ranks[1]->get("id", 5), "first");
  EXPECT_FALSE(aborts_within(*job.ranks[0], 0.3));
  job.ranks[1]->set("id", "second");
  for (const auto& c : job.ranks) {  // the setter is told too: nothing else would tell it
    ASSERT_TRUE(aborts_within(*c, 5)) << "rank " << c->rank();
    EXPECT_NE(c->abort_message().find("rank 1 failed: set coordinator key 'id' again with a different value"),
              std::string::npos) << c->abort_message();
  }
}

TEST(Coordinator, NextKeyCountsPerClient) {
  Job job(2);
  EXPECT_EQ(job.ranks[0]->next_key("t"), "t#0");
  EXPECT_EQ(job.ranks[0]->next_key("u"), "u#1");
  EXPECT_EQ(job.ranks[1]->next_key("t"), "t#0");
  EXPECT_THROW(job.ranks[1]->next_key("a b"), Error);  // refused, and counts nothing
  EXPECT_EQ(job.ranks[1]->next_key("u"), "u#1");
  // The exchange repeated with fresh keys reads fresh values (a reused key would read the first).
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<std::string>> got(2);
    on_all(job, [&](int r, CoordinatorClient& c) {
      got[size_t(r)] = c.all_gather(c.next_key("x"), std::to_string(10 * round + r), 5);
    });
    for (const auto& g : got) EXPECT_EQ(g, (std::vector<std::string>{std::to_string(10 * round), std::to_string(10 * round + 1)}));
  }
  job.finish();
}

// A second Team after the first finished (the launcher's coordinator outlives Teams): the same keys
// and barrier names start afresh, and the finished connections are no second claimants.
TEST(Coordinator, RanksJoiningAgainAfterFinishingStartFreshKeysAndBarriers) {
  Job job(2);
  on_all(job, [&](int r, CoordinatorClient& c) {
    EXPECT_EQ(c.all_gather("id", "old-" + std::to_string(r), 5), (std::vector<std::string>{"old-0", "old-1"}));
    c.barrier("ready", 5);
  });
  job.finish();  // finished, still connected (a Team finished but not yet destroyed)
  std::vector<std::unique_ptr<CoordinatorClient>> again(2);
  std::vector<std::vector<std::string>> got(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 asks before rank 1 joins
      again[size_t(r)] = std::make_unique<CoordinatorClient>("127.0.0.1", job.server.port(), r, 2, 10);
      again[size_t(r)]->set_exit_grace(0);
      got[size_t(r)] = again[size_t(r)]->all_gather("id", "new-" + std::to_string(r), 5);
      again[size_t(r)]->barrier("ready", 5);
    });
  for (auto& t : ts) t.join();
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<std::string>{"new-0", "new-1"}));
  for (const auto& c : again) {
    EXPECT_FALSE(c->aborted()) << c->abort_message();
    c->finish();
  }
  for (const auto& c : job.ranks) EXPECT_FALSE(c->aborted()) << c->abort_message();
}

TEST(Coordinator, OnAbortRegisteredAfterTheAbortRunsOutsideTheLock) {
  Job job(2);
  job.ranks[1]->fail("gone");
  ASSERT_TRUE(aborts_within(*job.ranks[0], 5));
  std::string seen;
  // The callback may call back into the client (here: a method that takes its lock).
  job.ranks[0]->on_abort([&] { seen = job.ranks[0]->abort_message(); });
  EXPECT_NE(seen.find("rank 1 failed: gone"), std::string::npos) << seen;
}

size_t open_fds() {
  size_t n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) != -1;
  return n;
}

TEST(Coordinator, TheServerClosesAConnectionWhenItsRankLeaves) {
  Job job(2);
  job.ranks[0]->set("k", "v");
  EXPECT_EQ(job.ranks[1]->get("k", 5), "v");  // both connections are accepted and said hello
  const size_t before = open_fds();
  job.ranks[0]->finish();
  job.ranks[0].reset();  // its socket closes; the server's end of it must close too, not at the job's end
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (open_fds() > before - 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(open_fds(), before - 2);
  EXPECT_FALSE(job.ranks[1]->aborted()) << job.ranks[1]->abort_message();
  job.ranks[1]->finish();
}

TEST(Coordinator, AClientClosingWithoutFinishingTellsTheOthersButNotItself) {
  Job job(2);
  std::atomic<bool> called{false};
  job.ranks[0]->on_abort([&] { called = true; });
  job.ranks[0].reset();  // e.g. unwinding from a user's exception: no finish()
  EXPECT_FALSE(called) << "its own end of the connection is not a lost coordinator";
  EXPECT_TRUE(aborts_within(*job.ranks[1], 5));
  EXPECT_NE(job.ranks[1]->abort_message().find("rank 0 failed"), std::string::npos) << job.ranks[1]->abort_message();
}

TEST(Coordinator, ServerServesUntilEveryRankSaidBye) {
  // Under torchrun rank 0 hosts the server and can tear it down while the others are between the
  // last barrier and their BYE: they must not see a lost coordinator.
  auto server = std::make_unique<CoordinatorServer>("127.0.0.1", 0, 2);
  std::vector<std::unique_ptr<CoordinatorClient>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<CoordinatorClient>("127.0.0.1", server->port(), r, 2, 10));
    ranks.back()->set_exit_grace(0);
  }
  std::thread other([&] { ranks[1]->barrier("end", 5); });
  ranks[0]->barrier("end", 5);  // both HELLOs are in: the server knows its ranks
  other.join();
  ranks[0]->finish();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ranks[1]->finish();
  });
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  late.join();
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 5.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (const auto& c : ranks) EXPECT_FALSE(c->aborted()) << "rank " << c->rank() << ": " << c->abort_message();
}

TEST(Coordinator, ConnectGivesUpAtItsDeadlineWhenTheHostIsSilent) {
  // A listener whose accept queue is full drops further SYNs, as a silent host does: a blocking
  // connect() would wait out the kernel's retries (~2 min).
  const int lis = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(lis, reinterpret_cast<sockaddr*>(&a), len), 0);
  ASSERT_EQ(::listen(lis, 0), 0);
  ASSERT_EQ(::getsockname(lis, reinterpret_cast<sockaddr*>(&a), &len), 0);
  RawRank queued(ntohs(a.sin_port));  // the queue's one place (backlog 0)
  const auto t0 = std::chrono::steady_clock::now();
  try {
    CoordinatorClient c("127.0.0.1", ntohs(a.sin_port), 0, 1, 0.5);
    ADD_FAILURE() << "connected to a full accept queue";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Timeout) << e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 3.0);
  ::close(lis);
}

TEST(Coordinator, HexRoundTripAndBadInput) {
  const std::string s("\x00\x7f\x80\xff", 4);
  EXPECT_EQ(from_hex(to_hex(s.data(), s.size())), s);
  test::expect_error([] { from_hex("abc"); }, Status::Internal, "odd-length hex value 'abc' (3 digits)");
  test::expect_error([] { from_hex("0azz"); }, Status::Internal, "bad hex digit 'z' in '0azz'");
}

// What the server is given is checked before a socket is opened: a port past 16 bits used to wrap
// (70000 listened on 4464) and a host name is not an address.
TEST(Coordinator, ServerRefusesBadWorldPortAndHost) {
  test::expect_invalid([] { CoordinatorServer s("127.0.0.1", 0, 0); }, "coordinator world size 0 must be >= 1");
  for (int port : {-1, 65536, 70000})
    test::expect_invalid([&] { CoordinatorServer s("127.0.0.1", port, 1); },
                         "coordinator port " + std::to_string(port) + " must be in [0, 65535]");
  test::expect_invalid([] { CoordinatorServer s("localhost", 0, 1); }, "'localhost' is not an IPv4 address");
}

TEST(Coordinator, ClientGivesUpWhenNobodyListens) {
  try {
    CoordinatorClient c("127.0.0.1", 1, 0, 1, 0.3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Timeout);
    EXPECT_NE(std::string(e.what()).find("could not reach the coordinator at 127.0.0.1:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace taxfree
