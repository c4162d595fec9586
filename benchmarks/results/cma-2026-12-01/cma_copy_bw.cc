#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <vector>
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<20; size_t w=(size_t)atol(argv[2])<<10;
  char* src=(char*)aligned_alloc(4096,n); memset(src,1,n);
  pid_t parent=getpid();
  std::vector<char> dst(n); memset(dst.data(),0,n);
  std::vector<char> tmp(w);
  for(int it=0;it<5;it++){
    auto t0=std::chrono::steady_clock::now();
    for(size_t x=0;x<n;x+=w){ iovec l{tmp.data(),w}, r{src+x,w}; process_vm_readv(parent,&l,1,&r,1,0);}  
    auto t1=std::chrono::steady_clock::now();
    for(size_t x=0;x<n;x+=w){ memcpy(tmp.data(), src+x, w);}  
    auto t2=std::chrono::steady_clock::now();
    for(size_t x=0;x<n;x+=w){ iovec l{tmp.data(),w}, r{dst.data()+x,w}; process_vm_writev(parent,&l,1,&r,1,0);}  
    auto t3=std::chrono::steady_clock::now();
    for(size_t x=0;x<n;x+=w){ memcpy(dst.data()+x, tmp.data(), w);}  
    auto t4=std::chrono::steady_clock::now();
    auto gb=[&](auto a,auto b){return n/std::chrono::duration<double>(b-a).count()/1e9;};
    printf("w=%zuK readv %.2f GB/s memcpy-read %.2f | writev %.2f memcpy-write %.2f\n", w>>10, gb(t0,t1), gb(t1,t2), gb(t2,t3), gb(t3,t4));
  }
}
