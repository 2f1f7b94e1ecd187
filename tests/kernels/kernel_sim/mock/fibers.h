// The simulation's CUDA threads as fibers: every thread of a launch runs on
// a stack of its own, all on the launching host thread, each until it waits
// (a barrier, an mbarrier, its warpgroup) and then the next in turn. One
// host thread per CUDA thread, all behind one lock, spent about half of the
// Hopper runs' CPU time waking threads to find they could not go on
// (bench/NOTES.md, "The simulation's CUDA threads as fibers"). Here a switch
// costs a few register moves, a thread runs as far as it can before another
// starts (so a missing barrier reads what no thread has written yet), and a
// deadlock shows at once: a round in which every thread waits and nothing
// moves.
//
// The turn passes through a launch's threads in an order drawn per launch
// (ascending, descending, from a random thread on, or shuffled), as a GPU
// promises none: a missing barrier whose writer happens to come first in one
// order reads unwritten memory in another. The draws follow the driver's
// seed (seed_order), so that a run replays.
//
// A CUDA thread's own variables (threadIdx, its cp.async groups, ...) are
// plain globals registered with Locals, which saves the running fiber's
// values and loads the next one's at every switch.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SIM_FIBER_ASAN 1
#include <sanitizer/asan_interface.h>
#endif

#if !defined(__x86_64__)
#error "the kernel simulation's fibers switch stacks with x86-64 code (kernel_sim/mock/fibers.h)"
#endif

// Saves the callee-saved registers, the SSE and x87 control words and the
// stack pointer into *from_sp, and resumes the context whose stack pointer is
// to_sp (System V x86-64: everything else is the caller's to save).
extern "C" void sim_fiber_switch(void** from_sp, void* to_sp);
asm(R"(
  .pushsection .text.sim_fiber_switch,"axG",@progbits,sim_fiber_switch,comdat
  .weak sim_fiber_switch
  .type sim_fiber_switch, @function
sim_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sim_fiber_switch, .-sim_fiber_switch
  .popsection
)");

namespace sim::fiber {

// Variables each fiber has its own value of: context 0 is the host thread,
// 1..n the fibers of the running launch. A switch swaps the running
// context's values out and the next one's in (no allocation, no virtual
// call: most of a switch's cost).
class Locals {
 public:
  template <class T>
  static bool add(T& variable) {
    slots().push_back({&variable, new std::vector<Box<T>>(), &swap_contexts<T>});
    return true;
  }
  static void switch_contexts(size_t from, size_t to) {
    for (const Slot& slot : slots()) slot.swap(slot.variable, slot.saved, from, to);
  }

 private:
  template <class T>
  struct Box {  // (not std::vector<bool>'s bits)
    T value{};
  };
  struct Slot {
    void* variable;
    void* saved;  // std::vector<Box<T>>: each context's value while another runs
    void (*swap)(void* variable, void* saved, size_t from, size_t to);
  };
  template <class T>
  static void swap_contexts(void* variable, void* saved, size_t from, size_t to) {
    using std::swap;
    T& running = *static_cast<T*>(variable);
    auto& values = *static_cast<std::vector<Box<T>>*>(saved);
    if (values.size() <= std::max(from, to)) values.resize(std::max(from, to) + 1);
    swap(values[from].value, running);
    swap(running, values[to].value);
  }
  static std::vector<Slot>& slots() {
    static std::vector<Slot> all;
    return all;
  }
};

// Bumped by whatever may let a waiting thread go on: an arrival, a copy
// landing, a thread leaving the kernel.
inline uint64_t progress = 0;
inline void moved() { ++progress; }

// The orders' random numbers (splitmix64: <random> would cost every unit
// that includes this header its parse).
inline uint64_t order_state = 1;
inline void seed_order(uint64_t seed) { order_state = seed; }
inline uint64_t next_random() {
  uint64_t z = order_state += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Context {
  void* sp = nullptr;
  unsigned char* stack = nullptr;  // lowest address of the mapping; its first page is a guard
  size_t stack_bytes = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's, for use-after-return
  bool finished = false;
};

inline constexpr size_t kStackBytes = size_t(1) << 20;
inline constexpr size_t kGuardBytes = 4096;

// The scheduler's state for the running launch (one at a time).
struct Scheduler {
  std::vector<Context> contexts;  // [0] the host thread
  std::vector<unsigned char*> stacks;  // mapped once, reused by later launches
  std::vector<size_t> order;  // the fibers (1..n) in the launch's order of turns
  size_t position = 0;        // the running fiber's place in it
  size_t current = 0, previous = 0;
  const std::function<void(unsigned)>* task = nullptr;
  uint64_t round_began = 0;  // progress when the round began
  bool voluntary = false;    // some fiber of this round yielded without waiting
  bool deadlocked = false;   // a round passed in which every fiber waited and nothing moved
  const void* host_stack_bottom = nullptr;
  size_t host_stack_bytes = 0;
};
inline Scheduler scheduler;

inline void switch_to(size_t to) {
  Scheduler& s = scheduler;
  const size_t from = s.current;
  Context& next = s.contexts[to];
  Locals::switch_contexts(from, to);
  s.previous = from, s.current = to;
#ifdef SIM_FIBER_ASAN
  // A finished fiber's fake stack goes with it.
  void** fake = s.contexts[from].finished ? nullptr : &s.contexts[from].fake_stack;
  if (to == 0) __sanitizer_start_switch_fiber(fake, s.host_stack_bottom, s.host_stack_bytes);
  else __sanitizer_start_switch_fiber(fake, next.stack + kGuardBytes, next.stack_bytes - kGuardBytes);
#endif
  sim_fiber_switch(&s.contexts[from].sp, next.sp);
#ifdef SIM_FIBER_ASAN
  __sanitizer_finish_switch_fiber(s.contexts[s.current].fake_stack, nullptr, nullptr);
#endif
}

// A round ends each time the turn passes the last fiber: one in which no
// fiber moved and every one waited means that none ever will.
inline void end_round() {
  Scheduler& s = scheduler;
  if (progress == s.round_began && !s.voluntary) {
    if (s.deadlocked) {
      fprintf(stderr, "deadlock: every thread of the launch waits, and none said what for\n");
      abort();
    }
    s.deadlocked = true;
  }
  s.round_began = progress, s.voluntary = false;
}

// Passes the turn to the next fiber that has not finished (the calling one
// again if it is the only one), or to the host once none is left.
inline void pass_turn() {
  Scheduler& s = scheduler;
  const size_t fibers = s.order.size();
  for (size_t step = 0; step < fibers; ++step) {
    s.position = (s.position + 1) % fibers;
    if (s.position == 0) end_round();
    const size_t f = s.order[s.position];
    if (s.contexts[f].finished) continue;
    if (f != s.current) switch_to(f);
    return;
  }
  switch_to(0);
}

[[noreturn]] inline void entry() {
  Scheduler& s = scheduler;
#ifdef SIM_FIBER_ASAN
  // The first switch into this fiber; from the host: where the host thread's stack lies.
  const void* bottom = nullptr;
  size_t bytes = 0;
  __sanitizer_finish_switch_fiber(nullptr, &bottom, &bytes);
  if (s.previous == 0) s.host_stack_bottom = bottom, s.host_stack_bytes = bytes;
#endif
  (*s.task)(unsigned(s.current - 1));
  s.contexts[s.current].finished = true;
  moved();
  pass_turn();
  fprintf(stderr, "a finished fiber was resumed\n");
  abort();
}

// The turn to the next fiber; the caller runs again once every other has
// had its turn. `waiting`: the caller cannot go on until another thread
// moves (otherwise it only lets the others run first).
inline void yield(bool waiting = true) {
  if (!waiting) scheduler.voluntary = true;
  pass_turn();
}

// Whether nothing can move: the caller, resumed while waiting, must report
// what it waits for and abort.
inline bool deadlocked() { return scheduler.deadlocked; }

// Waits until `done()`, letting the others run meanwhile; should no fiber
// be able to move, calls `report` (which says what the caller waits for)
// and aborts.
template <class Done, class Report>
void wait_until(Done&& done, Report&& report) {
  while (!done()) {
    if (deadlocked()) {
      report();
      abort();
    }
    yield();
  }
}

// Lets every other fiber run until it waits, then returns: what a thread
// does "a while later" on a device.
inline void let_others_run() {
  for (;;) {
    const uint64_t before = progress;
    yield(false);
    if (progress == before) return;
  }
}

// Runs task(t) for every t in [0, threads), each on a fiber of its own on
// the calling thread, and returns once all have returned.
inline void run(unsigned threads, const std::function<void(unsigned)>& task) {
  Scheduler& s = scheduler;
  if (s.task != nullptr) {
    fprintf(stderr, "a launch from inside a launch\n");
    abort();
  }
  while (s.stacks.size() < threads) {
    void* mapped = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    if (mapped == MAP_FAILED) {
      perror("mmap of a fiber's stack");
      abort();
    }
    mprotect(mapped, kGuardBytes, PROT_NONE);
    s.stacks.push_back(static_cast<unsigned char*>(mapped));
  }
  s.contexts.assign(threads + 1, Context{});
  uint32_t control[2] = {0, 0};  // the host's SSE and x87 control words, each fiber's to start with
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
  for (unsigned t = 0; t < threads; ++t) {
    Context& c = s.contexts[t + 1];
    c.stack = s.stacks[t], c.stack_bytes = kStackBytes;
#ifdef SIM_FIBER_ASAN
    // Frames a fiber of an earlier launch left behind (it never returns).
    ASAN_UNPOISON_MEMORY_REGION(c.stack + kGuardBytes, kStackBytes - kGuardBytes);
#endif
    // The frame sim_fiber_switch pops on the first switch: the control
    // words, six callee-saved registers, then entry() as the return address,
    // the stack aligned as at a call.
    auto* sp = reinterpret_cast<uint64_t*>(c.stack + kStackBytes);
    *--sp = 0;  // entry's own return address: none
    *--sp = reinterpret_cast<uint64_t>(&entry);
    for (int r = 0; r < 6; ++r) *--sp = 0;
    *--sp = uint64_t(control[0]) | uint64_t(control[1] & 0xffff) << 32;
    c.sp = sp;
  }
  s.order.resize(threads);
  const uint64_t draw = next_random();
  for (size_t i = 0; i < threads; ++i) {
    switch (draw % 4) {
      case 0: s.order[i] = i + 1; break;
      case 1: s.order[i] = threads - i; break;
      default: s.order[i] = (i + draw / 4) % threads + 1; break;
    }
  }
  if (draw % 4 == 3)
    for (size_t i = threads - 1; i > 0; --i) std::swap(s.order[i], s.order[next_random() % (i + 1)]);
  s.task = &task;
  s.deadlocked = false, s.voluntary = false, s.round_began = progress, s.position = 0;
  switch_to(s.order[0]);  // back once every fiber has finished
  s.task = nullptr;
}

// A barrier of `count` threads (std::barrier's arrive_and_wait), whose
// completion runs once all have arrived, before any goes on.
struct NoCompletion {
  void operator()() const noexcept {}
};
template <class Completion = NoCompletion>
class Barrier {
 public:
  explicit Barrier(int count, Completion completion = {}) : count_(count), completion_(std::move(completion)) {}
  // `report` says what the caller waits for, should nothing be able to move.
  template <class Report>
  void arrive_and_wait(Report&& report) {
    const uint64_t generation = generation_;
    moved();
    if (++arrived_ == count_) {
      arrived_ = 0;
      completion_();
      ++generation_;
      return;
    }
    wait_until([&] { return generation_ != generation; }, report);
  }

 private:
  int count_, arrived_ = 0;
  uint64_t generation_ = 0;
  Completion completion_;
};

}  // namespace sim::fiber
