// What a daemon prints when it dies of a signal: the signal, the faulting thread's stack trace
// (symbolized) on stderr, where the launcher's log captures it, then the default action (a core
// dump where enabled). Abseil's failure signal handler does the work.
//
// A stack overflow faults with no stack left to run a handler on, so the handler runs on an
// alternate signal stack. POSIX gives those per thread: InstallCrashHandler sets one up for the
// calling thread, and every long-lived thread a daemon starts (server threads that parse what
// clients send) calls UseAlternateSignalStack() once at its start.
//
// Thread safety: InstallCrashHandler once per process, early in main() (InitLogging calls it);
// UseAlternateSignalStack from any thread, for that thread.
#ifndef TANDEM_COMMON_CRASH_HANDLER_H_
#define TANDEM_COMMON_CRASH_HANDLER_H_

namespace tandem {

// Installs the handler for SIGSEGV, SIGILL, SIGFPE, SIGABRT, SIGBUS and SIGTRAP (absl's set;
// SIGTERM stays the daemons' graceful stop); `argv0` finds the binary's symbols.
void InstallCrashHandler(const char* argv0);

// Gives the calling thread an alternate signal stack (kept until the thread exits), unless it
// has one. Cheap to call again.
void UseAlternateSignalStack();

}  // namespace tandem

#endif  // TANDEM_COMMON_CRASH_HANDLER_H_
