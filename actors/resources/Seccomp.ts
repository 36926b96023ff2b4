/**
 * The system-call policy of the sandboxes, one policy in two forms: {@link dockerProfile}, the JSON that
 * `docker run --security-opt seccomp=…` takes, and {@link bpf}, a classic BPF program for `bwrap --seccomp FD`.
 *
 * The reference is Docker's default profile (moby `profiles/seccomp/default.json`) for a container without added
 * capabilities, with three kinds of call taken out, since nothing in a sandbox needs them:
 *
 * - `io_uring_setup`, `io_uring_enter`, `io_uring_register`: their submissions bypass per-call filtering; moby
 *   removed them from its profile in Docker 25 (moby#46762), but older or distribution-built engines still allow
 *   them;
 * - `ptrace`, `process_vm_readv`, `process_vm_writev`: reading or steering another process (the sandbox's
 *   supervisor must not be traced, whatever its dumpable flag says).
 *
 * As in Docker's profile: every call not listed fails with `EPERM`; `clone` with a namespace flag, `socket` of
 * family `AF_VSOCK` and `personality` other than the five usual personas fail with `EPERM`; `clone3` fails with
 * `ENOSYS`, so that the C library falls back to `clone`, whose flags a filter can read. The BPF form also answers
 * `ENOSYS` for calls newer than its table (libraries probe new calls and fall back on `ENOSYS`, as runc arranges),
 * kills a process that calls through another ABI (32-bit `int 0x80`), and refuses x32 calls.
 *
 * @since 0.1.0
 */
import { x86_64, x86_64Max } from "./internal/syscalls.ts"

/**
 * The calls allowed without condition (x86_64 names; Docker's list less the calls above).
 *
 * @category models
 * @since 0.1.0
 */
export const allowed: ReadonlyArray<string> = [
  "accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl", "bind", "brk", "capget", "capset", "chdir",
  "chmod", "chown", "clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep", "close", "close_range",
  "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl",
  "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve",
  "execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64", "fallocate", "fanotify_mark", "fchdir",
  "fchmod", "fchmodat", "fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork",
  "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync", "ftruncate", "futex", "futex_waitv", "futimesat",
  "getcpu", "getcwd", "getdents", "getdents64", "getegid", "geteuid", "getgid", "getgroups", "getitimer",
  "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid", "getresuid",
  "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid",
  "gettimeofday", "getuid", "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
  "io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "ioprio_get", "ioprio_set", "io_setup",
  "io_submit", "kill", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
  "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr", "lremovexattr", "lseek", "lsetxattr", "lstat",
  "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat",
  "mlock", "mlock2", "mlockall", "mmap", "modify_ldt", "mprotect", "mq_getsetattr", "mq_notify", "mq_open",
  "mq_timedreceive", "mq_timedsend", "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync",
  "munlock", "munlockall", "munmap", "name_to_handle_at", "nanosleep", "newfstatat", "open", "openat", "openat2",
  "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll",
  "ppoll", "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6", "pwrite64",
  "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recvfrom", "recvmmsg", "recvmsg",
  "remap_file_pages", "removexattr", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
  "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
  "rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr", "sched_getparam",
  "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
  "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select",
  "semctl", "semget", "semop", "semtimedop", "sendfile", "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsuid",
  "setgid", "setgroups", "setitimer", "setpgid", "setpriority", "setregid", "setresgid", "setresuid", "setreuid",
  "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area", "set_tid_address", "setuid",
  "setxattr", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4",
  "socketpair", "splice", "stat", "statfs", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs",
  "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime",
  "timer_settime", "timerfd_create", "timerfd_gettime", "timerfd_settime", "times", "tkill", "truncate", "umask",
  "uname", "unlink", "unlinkat", "utime", "utimensat", "utimes", "vfork", "vmsplice", "wait4", "waitid", "write",
  "writev"
]

/** `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET`. */
const namespaceFlags = 0x7e020000
const AF_VSOCK = 40
/** `PER_LINUX`, `UNAME26`, `PER_LINUX32`, `UNAME26 | PER_LINUX32`, and the query `0xffffffff`. */
const personas = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff]
const EPERM = 1
const ENOSYS = 38

const scmpArch: Record<string, string> = { x64: "SCMP_ARCH_X86_64", arm64: "SCMP_ARCH_AARCH64" }

/**
 * The policy as a Docker seccomp profile (JSON), for the engine's architecture.
 *
 * @category constructors
 * @since 0.1.0
 */
export const dockerProfile = (arch: string = process.arch): string =>
  JSON.stringify({
    defaultAction: "SCMP_ACT_ERRNO",
    defaultErrnoRet: EPERM,
    architectures: [scmpArch[arch] ?? "SCMP_ARCH_NATIVE"],
    syscalls: [
      { names: allowed, action: "SCMP_ACT_ALLOW" },
      { names: ["socket"], action: "SCMP_ACT_ALLOW", args: [{ index: 0, value: AF_VSOCK, op: "SCMP_CMP_NE" }] },
      ...personas.map((value) => ({
        names: ["personality"],
        action: "SCMP_ACT_ALLOW",
        args: [{ index: 0, value, op: "SCMP_CMP_EQ" }]
      })),
      {
        names: ["clone"],
        action: "SCMP_ACT_ALLOW",
        args: [{ index: 0, value: namespaceFlags, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ" }]
      },
      { names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: ENOSYS }
    ]
  })

// ===== Classic BPF =====

// Opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
const LD_W_ABS = 0x20
const JEQ = 0x15
const JGT = 0x25
const JGE = 0x35
const JSET = 0x45
const RET = 0x06
const RET_KILL_PROCESS = 0x80000000
const RET_ERRNO = 0x00050000
const RET_ALLOW = 0x7fff0000
const AUDIT_ARCH_X86_64 = 0xc000003e
const X32_BIT = 0x40000000
// Offsets in `struct seccomp_data`: nr, arch, then args[i] at 16 + 8i (little-endian: low word first).
const NR = 0
const ARCH = 4
const arg0Low = 16
const arg0High = 20

type Insn = readonly [code: number, jt: number, jf: number, k: number]

const ld = (offset: number): Insn => [LD_W_ABS, 0, 0, offset]
const ret = (value: number): Insn => [RET, 0, 0, value >>> 0]
/** Runs `body` (which must end in a return) when the call number is `nr`; otherwise falls through past it. */
const when = (nr: number, body: ReadonlyArray<Insn>): Array<Insn> => [[JEQ, 0, body.length, nr], ...body]

/** Contiguous runs of the allowed numbers: `[lo, hi]` each. */
const runs = (numbers: ReadonlyArray<number>): Array<readonly [number, number]> => {
  const out: Array<[number, number]> = []
  for (const n of [...numbers].sort((a, b) => a - b)) {
    const last = out.at(-1)
    if (last !== undefined && last[1] + 1 === n) last[1] = n
    else out.push([n, n])
  }
  return out
}

const numberOf = (name: string): number => {
  const nr = x86_64[name]
  if (nr === undefined) throw new Error(`Seccomp: no x86_64 number for ${name}`)
  return nr
}

/**
 * The policy as a classic BPF program (`struct sock_filter` array, host byte order) for `bwrap --seccomp FD`, or
 * `undefined` on an architecture the table does not cover (only x86_64 is).
 *
 * @category constructors
 * @since 0.1.0
 */
export const bpf = (arch: string = process.arch): Buffer | undefined => {
  if (arch !== "x64") return undefined
  const program: Array<Insn> = [
    ld(ARCH),
    [JEQ, 1, 0, AUDIT_ARCH_X86_64],
    ret(RET_KILL_PROCESS),
    ld(NR),
    [JGE, 0, 1, X32_BIT],
    ret(RET_ERRNO | EPERM),
    ...when(numberOf("clone"), [ld(arg0Low), [JSET, 0, 1, namespaceFlags], ret(RET_ERRNO | EPERM), ret(RET_ALLOW)]),
    ...when(numberOf("clone3"), [ret(RET_ERRNO | ENOSYS)]),
    ...when(numberOf("socket"), [ld(arg0Low), [JEQ, 0, 1, AF_VSOCK], ret(RET_ERRNO | EPERM), ret(RET_ALLOW)]),
    ...when(numberOf("personality"), [
      ld(arg0High),
      [JEQ, 0, personas.length + 1, 0],
      ld(arg0Low),
      ...personas.map((p, i): Insn => [JEQ, personas.length - i, 0, p]),
      ret(RET_ERRNO | EPERM),
      ret(RET_ALLOW)
    ])
  ]
  for (const [lo, hi] of runs(allowed.map(numberOf))) {
    if (lo === hi) program.push([JEQ, 0, 1, lo], ret(RET_ALLOW))
    else program.push([JGE, 0, 2, lo], [JGT, 1, 0, hi], ret(RET_ALLOW))
  }
  program.push([JGT, 0, 1, x86_64Max], ret(RET_ERRNO | ENOSYS), ret(RET_ERRNO | EPERM))
  const buffer = Buffer.alloc(program.length * 8)
  program.forEach(([code, jt, jf, k], i) => {
    buffer.writeUInt16LE(code, i * 8)
    buffer.writeUInt8(jt, i * 8 + 2)
    buffer.writeUInt8(jf, i * 8 + 3)
    buffer.writeUInt32LE(k >>> 0, i * 8 + 4)
  })
  return buffer
}
