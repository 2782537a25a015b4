/* Minimal C test reporter: "FAIL - name: why" per failure, "N passed, N failed" at the end. */
#ifndef FD_TCHECK_H
#define FD_TCHECK_H

/* Record one check; on failure print the formatted reason. Returns cond. */
int t_check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print the closing line; returns the process exit status. */
int t_done(void);
#endif
