/* The cost of starting a child in a new cgroup: clone3(CLONE_INTO_CGROUP)
 * against fork and a write of its pid to cgroup.procs (what hull's landlock
 * tier does today), 100 ms apart. As root; CGROUP2 is where cgroup2 is
 * mounted (default /sys/fs/cgroup/unified).
 *   gcc -O2 benches/experiments/clone_into_cgroup.c && sudo ./a.out */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/sched.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(){
  const char*base=getenv("CGROUP2")?getenv("CGROUP2"):"/sys/fs/cgroup/unified";
  char p[256];
  for(int i=0;i<8;i++){
    usleep(100000);
    snprintf(p,sizeof p,"%s/hull-c3-a%d",base,i); mkdir(p,0755);
    int fd=open(p,O_RDONLY|O_DIRECTORY|O_CLOEXEC);
    struct clone_args a; memset(&a,0,sizeof a);
    a.flags=CLONE_INTO_CGROUP; a.exit_signal=SIGCHLD; a.cgroup=fd;
    double t=now();
    long pid=syscall(SYS_clone3,&a,sizeof a);
    if(pid==0){_exit(0);}
    double t1=now();
    waitpid(pid,0,0);
    /* migration variant */
    usleep(100000);
    char q[256]; snprintf(q,sizeof q,"%s/hull-c3-b%d",base,i); mkdir(q,0755);
    char procs[300]; snprintf(procs,sizeof procs,"%s/cgroup.procs",q);
    int pf=open(procs,O_WRONLY|O_CLOEXEC);
    double t2=now();
    pid_t c=fork();
    if(c==0){char b[32];int n=snprintf(b,sizeof b,"%d",getpid());write(pf,b,n);_exit(0);}
    waitpid(c,0,0);
    double t3=now();
    printf("clone3 into cgroup %.2f ms | fork+move+exit %.2f ms\n",t1-t,t3-t2);
    close(fd);close(pf);
    usleep(20000); rmdir(p); rmdir(q);
  }
}
