# RESHAPE_PTHREAD: find the flags that build and link threaded code.
# Sets PTHREAD_CFLAGS and PTHREAD_LIBS.
AC_DEFUN([RESHAPE_PTHREAD], [
  AC_MSG_CHECKING([whether $CC accepts -pthread])
  old_CFLAGS="$CFLAGS"
  CFLAGS="$CFLAGS -pthread"
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <pthread.h>]],
                                  [[pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
                                    return pthread_mutex_lock (&m);]])],
    [AC_MSG_RESULT([yes]); PTHREAD_CFLAGS="-pthread"; PTHREAD_LIBS="-pthread"],
    [AC_MSG_RESULT([no]); PTHREAD_CFLAGS=""
     AC_SEARCH_LIBS([pthread_create], [pthread],
                    [PTHREAD_LIBS="$ac_cv_search_pthread_create"],
                    [AC_MSG_ERROR([no POSIX threads])])
     AS_IF([test "x$PTHREAD_LIBS" = "xnone required"], [PTHREAD_LIBS=""])])
  CFLAGS="$old_CFLAGS"
  AC_SUBST([PTHREAD_CFLAGS])
  AC_SUBST([PTHREAD_LIBS])
])
