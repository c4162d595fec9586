#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cstdlib>
struct Ctl { std::atomic<int> bar[2]; pid_t pid[2]; float* buf[2]; };
static void barrier(Ctl* c, int me, int& gen){ gen++; c->bar[me].store(gen); while(c->bar[1-me].load()<gen){} }
int main(int argc,char**argv){
  size_t n = (argc>1?atol(argv[1]):64)<<20; n/=4;
  size_t piece = (argc>2?atol(argv[2]):128)<<10; piece/=4;
  Ctl* c=(Ctl*)mmap(nullptr,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  new(c) Ctl{};
  int me = fork()==0 ? 1 : 0;
  float* b=(float*)aligned_alloc(4096,n*4); for(size_t i=0;i<n;i++) b[i]=me+1;
  c->pid[me]=getpid(); c->buf[me]=b; int gen=0; barrier(c,me,gen);
  std::vector<float> tmp(piece);
  size_t half=n/2, lo= me? half: 0, hi= me? n: half; pid_t peer=c->pid[1-me]; float* pb=c->buf[1-me];
  for(int it=0;it<12;it++){
    for(size_t i=0;i<n;i++) b[i]=me+1;
    barrier(c,me,gen);
    auto t0=std::chrono::steady_clock::now();
    for(size_t x=lo;x<hi;x+=piece){ size_t m=std::min(piece,hi-x);
      iovec l{tmp.data(),m*4}, r{pb+x,m*4};
      if(process_vm_readv(peer,&l,1,&r,1,0)!=(ssize_t)(m*4)){perror("readv");return 1;}
      float* o=b+x; for(size_t i=0;i<m;i++) o[i]+=tmp[i];
      iovec l2{o,m*4}, r2{pb+x,m*4};
      if(process_vm_writev(peer,&l2,1,&r2,1,0)!=(ssize_t)(m*4)){perror("writev");return 1;}
    }
    barrier(c,me,gen);
    auto t1=std::chrono::steady_clock::now();
    double s=std::chrono::duration<double>(t1-t0).count();
    for(size_t i=0;i<n;i++) if(b[i]!=3){printf("bad %zu %f\n",i,b[i]);return 1;}
    if(me==0) printf("%zu MiB: %.2f ms busbw %.2f GB/s\n", n*4>>20, s*1e3, n*4/s/1e9);
  }
  if(!me) wait(nullptr);
}
